"""Admin commands against a running daemon: status, skip, disable, enable, resync, drop."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, pgsub, wait_confirmed, write_subscriptions
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.e2e

# No Java to be found: any command that starts a Spark session fails.
NO_JVM = {**os.environ, "JAVA_HOME": "/nonexistent"}
KV = "CREATE TABLE kv (k int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE kv"


def subscription(daemon: DaemonProcess, name: str) -> dict[str, Any]:
    status, body = daemon.get("/status")
    assert status == 200
    return next(s for s in body["subscriptions"] if s["name"] == name)


def delta_keys(spark: Any, warehouse: Path) -> list[int]:
    frame = spark.read.format("delta").load(str(warehouse / "public" / "kv"))
    return sorted(r["k"] for r in frame.collect())


def test_skip_reaches_a_daemon_stuck_on_the_transaction(
    publisher: PgDatabase, spark: Any, tmp_path: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    other = PgDatabase.create(publisher.cluster, "pub")
    try:
        publisher.execute(KV)
        other.execute(KV)
        warehouse = tmp_path / "warehouse"
        config = tmp_path / "pgsub.yaml"
        port = write_subscriptions(
            config, warehouse, {"sa": publisher, "sb": other}, shared_tables=True
        )
        daemon = daemons(config, port)
        daemon.wait_ready()
        publisher.execute("INSERT INTO kv VALUES (5, 'from a')")
        wait_confirmed(publisher, "sa")
        # Key 5 came from the first publisher: insert_exists stops the second.
        other.execute(
            "BEGIN; INSERT INTO kv VALUES (100, 'b'); INSERT INTO kv VALUES (5, 'b'); COMMIT"
        )

        def failed_at() -> str | None:
            found = re.search(
                r"finished at (\S+/\S+)", subscription(daemon, "sb")["last_error"] or ""
            )
            return found.group(1) if found else None

        wait_until(failed_at, timeout=180, what="sb to stop on insert_exists")
        lsn = failed_at()
        assert lsn is not None
        result = pgsub("skip", "-c", str(config), "sb", "--lsn", lsn)
        assert result.returncode == 0, result.stderr
        other.execute("INSERT INTO kv VALUES (101, 'after')")
        wait_confirmed(other, "sb", timeout=120)
        assert delta_keys(spark, warehouse) == [5, 101]
        events = [e["event"] for e in daemon.events()]
        assert f"logical replication starts skipping transaction at LSN {lsn}" in events
        assert daemon.terminate() == 0
        traces = daemon.logs().count("\tat org.apache.spark")
        assert traces == 0, "JVM stack traces belong at debug level"
    finally:
        other.drop()


def test_status_resync_and_drop_of_a_subscription(
    publisher: PgDatabase, spark: Any, tmp_path: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    from tests.support.daemon import write_config

    publisher.execute(KV + "; INSERT INTO kv SELECT g, 'v' FROM generate_series(1, 300) g")
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, warehouse, copy_data=True)
    daemon = daemons(config, port)
    daemon.wait_ready()
    wait_until(lambda: table_state(daemon) == "ready", timeout=180, what="kv READY")
    # The first start's load makes the table READY before the leader streams from the slot.
    wait_until(
        lambda: subscription(daemon, "sub1")["state"] == "streaming",
        timeout=60,
        what="the leader streaming once the initial load ended",
    )
    path = str(warehouse / "public" / "kv")

    # pgsub status, from the running daemon: the view of pg_stat_subscription & co.
    live = pgsub("status", "-c", str(config), "--json")
    assert live.returncode == 0, live.stderr
    view = json.loads(live.stdout)
    assert view["source"] == "daemon"
    (sub,) = view["subscriptions"]
    assert sub["state"] == "streaming" and sub["enabled"] and sub["error_count"] == 0
    assert sub["flushed_lsn"] and sub["replication_lag_bytes"] is not None
    assert sub["tables"][0]["table"] == "public.kv" and sub["tables"][0]["state"] == "ready"
    text = pgsub("status", "-c", str(config), "sub1")
    assert text.returncode == 0 and "ready (r)" in text.stdout, text.stdout

    # pgsub disable: streaming stops within its bound, nothing arrives until enabled. On a
    # local warehouse it, enable, resync and the stored status need no JVM (delta-rs).
    disabled = pgsub("disable", "-c", str(config), "sub1", env=NO_JVM)
    assert disabled.returncode == 0, disabled.stderr
    wait_until(
        lambda: subscription(daemon, "sub1")["state"] == "disabled",
        timeout=10,
        what="the subscription to stop (pgsub disable --help: within 5 s)",
    )
    publisher.execute("INSERT INTO kv VALUES (301, 'while disabled')")
    slot_active = "SELECT active FROM pg_replication_slots WHERE slot_name = 'sub1'"
    wait_until(lambda: publisher.fetchval(slot_active) is False, timeout=10, what="slot idle")
    assert 301 not in delta_keys(spark, warehouse)
    assert pgsub("enable", "-c", str(config), "sub1", env=NO_JVM).returncode == 0
    wait_confirmed(publisher, timeout=120)
    assert 301 in delta_keys(spark, warehouse)

    # pgsub resync: someone deleted rows by hand; the copy puts every row back.
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k <= 100")  # someone else's hand

    def copies() -> int:
        # Not "READY left, then back": a small table's resync can pass between two polls.
        return sum(1 for e in daemon.events() if e["event"] == "table copy finished")

    copied_before = copies()
    result = pgsub("resync", "-c", str(config), "sub1", "kv", env=NO_JVM)
    assert result.returncode == 0, result.stderr
    assert "public.kv will be copied again" in result.stdout
    publisher.execute("UPDATE kv SET v = 'during' WHERE k % 10 = 0")
    wait_until(
        lambda: copies() > copied_before and table_state(daemon) == "ready",
        timeout=180,
        what="kv copied again and READY",
    )
    wait_confirmed(publisher)
    with publisher.connect() as conn:
        assert_delta_equals_publisher(conn, "public.kv", spark, path, ("k",))
    unknown = pgsub("resync", "-c", str(config), "sub1", "nosuch")
    assert unknown.returncode == 2 and "has no table public.nosuch" in unknown.stderr

    refused = pgsub("drop", "-c", str(config), "sub1")
    assert refused.returncode == 1 and "is being streamed" in refused.stderr
    assert daemon.terminate() == 0

    # pgsub status without a daemon: the state store and the publisher's slot.
    stored = pgsub("status", "-c", str(config), "--json", env=NO_JVM)
    assert stored.returncode == 0, stored.stderr
    view = json.loads(stored.stdout)
    assert view["source"] == "state store"
    (sub,) = view["subscriptions"]
    assert sub["slot_exists"] and not sub["slot_active"] and sub["confirmed_flush_lsn"]
    assert [(t["table"], t["state"]) for t in sub["tables"]] == [("public.kv", "ready")]
    dropped = pgsub("drop", "-c", str(config), "sub1")
    assert dropped.returncode == 0, dropped.stderr
    assert publisher.slots() == []
    assert spark.read.format("delta").load(path).count() == 301  # the data stays
    states = spark.read.format("delta").load(str(warehouse / "_pgsub" / "table_states"))
    assert states.where("subscription = 'sub1'").count() == 0


def table_state(daemon: DaemonProcess, table: str = "public.kv") -> str | None:
    try:
        body = daemon.get("/status")[1]
    except OSError:
        return None  # not serving yet
    subscriptions = [s for s in body.get("subscriptions", []) if s["name"] == "sub1"]
    tables = (subscriptions[0].get("tables") or []) if subscriptions else []
    return next((t["state"] for t in tables if t["table"] == table), None)


def test_a_vanished_slot_stops_the_subscription_instead_of_skipping_changes(
    publisher: PgDatabase, spark: Any, tmp_path: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    from tests.support.daemon import write_config

    publisher.execute(KV)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, warehouse)
    daemon = daemons(config, port)
    daemon.wait_ready()
    publisher.execute("INSERT INTO kv VALUES (1, 'before')")
    wait_confirmed(publisher)

    def drop_slot() -> bool:
        publisher.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE slot_name = 'sub1' AND active_pid IS NOT NULL"
        )
        try:
            publisher.execute("SELECT pg_drop_replication_slot('sub1')")
        except Exception:  # the daemon reconnected in between: try again
            return False
        return True

    wait_until(drop_slot, timeout=30, interval=0.2, what="the slot to be dropped")
    publisher.execute("INSERT INTO kv SELECT g, 'lost?' FROM generate_series(2, 101) g")

    def stopped() -> bool:
        sub = subscription(daemon, "sub1")
        return sub["state"] == "error" and 'slot "sub1" does not exist' in (sub["last_error"] or "")

    wait_until(stopped, timeout=60, what="the subscription to stop on the missing slot")
    publisher.execute("INSERT INTO kv VALUES (102, 'after')")
    wait_until(lambda: daemon.get("/readyz")[0] == 503, timeout=30, what="/readyz to fail")
    metrics = daemon.get("/metrics")[1]
    assert 'pgsub_apply_errors_total{subscription="sub1"}' in metrics
    assert publisher.slots() == []  # never recreated behind the operator's back
    assert delta_keys(spark, warehouse) == [1]

    # The way out the error names: drop the subscription, run it again (copies anew).
    assert daemon.terminate() == 0
    assert pgsub("drop", "-c", str(config), "sub1").returncode == 0
    port = write_config(config, publisher, warehouse, copy_data=True)
    again = daemons(config, port)
    wait_until(lambda: table_state(again) == "ready", timeout=180, what="kv copied again")
    wait_confirmed(publisher)
    with publisher.connect() as conn:
        assert_delta_equals_publisher(
            conn, "public.kv", spark, str(warehouse / "public" / "kv"), ("k",)
        )
    assert again.terminate() == 0
