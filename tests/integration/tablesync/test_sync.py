"""Initial copy and handoff against a real publisher: oracle equality, states, slots."""

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tablesync.state import TableState
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def all_ready(rep: Replication) -> bool:
    assert rep.runner is not None
    statuses = rep.runner.coordinator.statuses
    return bool(statuses) and all(s.state is TableState.READY for s in statuses)


def test_initial_sync_under_a_write_workload(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10,2));"
        "CREATE TABLE b (id bigint PRIMARY KEY, doc jsonb, at timestamptz);"
        "CREATE TABLE c (x int, y text);"  # no key: inserts only
        "CREATE TABLE empty (id int PRIMARY KEY);"
        "INSERT INTO a SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, 20000) g;"
        "INSERT INTO b SELECT g, jsonb_build_object('g', g), now() FROM generate_series(1, 5000) g;"
        "INSERT INTO c SELECT g % 7, 'c' FROM generate_series(1, 3000) g;"
        "CREATE PUBLICATION pub FOR TABLE a, b, c, empty"
    )
    stop = threading.Event()

    def workload() -> None:
        n = 0
        with publisher.connect() as conn:
            while not stop.is_set():
                n += 1
                conn.execute("UPDATE a SET v = v || '.' WHERE id = %s", [n % 20000 + 1])
                conn.execute("INSERT INTO b VALUES (%s, '{}', now())", [100000 + n])
                conn.execute("DELETE FROM b WHERE id = %s", [n])
                conn.execute("INSERT INTO c VALUES (%s, 'w')", [n])
                time.sleep(0.01)

    writer = threading.Thread(target=workload, daemon=True)
    writer.start()
    try:
        with Replication(publisher, spark, warehouse, copy_data=True, max_sync_workers=2) as rep:
            wait_until(lambda: all_ready(rep), timeout=300, what="every table to be READY")
            time.sleep(2)  # keep writing after the handoff
            stop.set()
            writer.join()
            rep.caught_up()
            rep.assert_equal("public.a", "public.b", key=("id",))
            rep.assert_equal("public.c", "public.empty")
            # Only the subscription's own slot remains: sync slots are dropped when done.
            assert publisher.slots() == ["sub1"]
            metrics = rep.metrics.registry
            copied = metrics.get_sample_value(
                "pgsub_tablesync_rows_copied_total",
                {"subscription": "sub1", "relation": "public.a"},
            )
            assert copied is not None and copied >= 20000
            ready = metrics.get_sample_value(
                "pgsub_table_state",
                {"subscription": "sub1", "relation": "public.b", "state": "ready"},
            )
            assert ready == 1
    finally:
        stop.set()
