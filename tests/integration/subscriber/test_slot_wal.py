"""A slot that never hoards WAL: confirmed while only unpublished tables change, its retained
WAL in the metrics and /status, and an invalidated slot named with the way out."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from subscriber.runtime import admin, slots
from subscriber.runtime.config import Config, SubscriptionConfig
from tests.support.pgcluster import PgCluster, wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

BUSY = "INSERT INTO busy SELECT g, repeat('x', 500) FROM generate_series(1, 20000) g"


def retained(publisher: PgDatabase, slot: str = "sub1") -> int:
    return int(
        publisher.fetchval(
            "SELECT pg_current_wal_lsn() - restart_lsn FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [slot],
        )
    )


def test_a_busy_unpublished_table_does_not_make_the_slot_hoard_wal(
    publisher: PgDatabase, spark: Any, warehouse: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(slots, "SLOT_WATCH_INTERVAL", 0.5)
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE busy (id int, pad text);"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(publisher, spark, warehouse) as rep:
        written = 0
        for _ in range(6):  # about 80 MB of WAL nobody subscribes to
            before = publisher.fetchval("SELECT pg_current_wal_lsn()::text")
            publisher.execute(BUSY)
            written += int(publisher.fetchval(f"SELECT pg_current_wal_lsn() - '{before}'"))
        assert written > 48 << 20

        def bounded() -> bool:
            publisher.execute("CHECKPOINT")  # logs the running transactions the slot moves on
            return retained(publisher) < 16 << 20

        wait_until(bounded, timeout=120, interval=2, what="the slot to let the busy WAL go")
        runner = rep.runner
        assert runner is not None

        def watched() -> bool:
            kept = runner.status.slot_retained_wal_bytes
            return kept is not None and kept < 16 << 20

        wait_until(watched, timeout=30, what="/status to show the slot's retained WAL")
        assert runner.status.slot_wal_status in ("reserved", "extended")
        metrics = rep.metrics.registry
        kept = metrics.get_sample_value("pgsub_slot_retained_wal_bytes", {"subscription": "sub1"})
        assert kept is not None and kept < 16 << 20
        status = {"subscription": "sub1", "status": runner.status.slot_wal_status or ""}
        assert metrics.get_sample_value("pgsub_slot_wal_status", status) == 1
        no_limit = metrics.get_sample_value(
            "pgsub_slot_safe_wal_size_bytes", {"subscription": "sub1"}
        )
        assert no_limit is None  # max_slot_wal_keep_size is -1 here: no limit, no series


def test_an_invalidated_slot_is_an_error_naming_the_way_out(
    pg_cluster: Callable[..., PgCluster], spark: Any, warehouse: Path
) -> None:
    publisher = PgDatabase.create(pg_cluster(max_slot_wal_keep_size="32MB"), "pub")
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE busy (id int, pad text);"
        "CREATE PUBLICATION pub FOR TABLE t;"
        "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 10) g"
    )
    rep = Replication(publisher, spark, warehouse, copy_data=True)
    with rep:
        wait_until(rep.all_ready, timeout=120, what="the table to be READY")
        publisher.execute("INSERT INTO t VALUES (11, 'b')")
        rep.caught_up()
    # pgsub is down while the publisher writes past max_slot_wal_keep_size.
    publisher.execute("UPDATE t SET v = 'lost' WHERE id = 1")
    for _ in range(8):
        publisher.execute(BUSY + "; SELECT pg_switch_wal()")
    publisher.execute("CHECKPOINT")
    status = publisher.fetchval(
        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'sub1'"
    )
    assert status == "lost"
    rep.start(wait=False)  # it cannot stream any more
    runner = rep.runner
    assert runner is not None
    try:
        wait_until(
            lambda: "invalidated slot 'sub1'" in (runner.status.last_error or ""),
            timeout=120,
            what="an error naming the invalidated slot",
        )
        error = runner.status.last_error or ""
        assert "`pgsub drop -c <config> sub1`" in error and "copies every table" in error
    finally:
        rep.stop()
    # The way out the error names: drop, start again, every table copied anew.
    admin.drop(
        Config(warehouse=str(warehouse), subscriptions=[rep.config]), rep.config, keep_slot=False
    )
    again = Replication(publisher, spark, warehouse, copy_data=True)
    with again:
        wait_until(again.all_ready, timeout=120, what="every table copied again")
        again.caught_up()
        again.assert_equal("public.t", key=("id",))


def test_the_heartbeat_runs_its_statement_while_streaming(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE beats (at timestamptz);"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    heartbeat = {"interval": "0.5s", "statement": "INSERT INTO beats VALUES (now())"}
    with Replication(publisher, spark, warehouse, heartbeat=heartbeat) as rep:
        wait_until(
            lambda: publisher.fetchval("SELECT count(*) FROM beats") >= 3,
            timeout=60,
            what="three heartbeats",
        )
        publisher.execute("INSERT INTO t VALUES (1)")
        rep.caught_up()
        assert [r["id"] for r in rep.rows("public.t")] == [1]


def test_a_failing_heartbeat_is_logged_and_raises_nothing(publisher: PgDatabase) -> None:
    config = SubscriptionConfig(
        name="sub1",
        connection=publisher.dsn,
        publications=["pub"],
        heartbeat={"interval": "0.01s", "statement": "INSERT INTO no_such_table VALUES (1)"},
    )
    beating = slots.Heartbeat(config, config.conninfo())
    time.sleep(0.02)
    with capture_logs() as logs:
        beating.beat()
    assert beating.beats == 0
    assert [entry["event"] for entry in logs] == ["heartbeat failed"]
    assert "no_such_table" in logs[0]["error"]
