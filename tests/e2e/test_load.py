"""Copy and apply under a saturating write load: keyed and keyless tables lose no row.

A writer commits one row into each table per transaction as fast as it can,
from before the daemon starts until after both tables are READY, and now and
then deletes an earlier row of the keyless table by ctid; batches are small,
so they close on size while a sync worker catches up and hands over.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.daemon import DaemonProcess, wait_confirmed, write_config
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.writer import Writer

pytestmark = pytest.mark.e2e

ROWS = 20_000
FAST = 6_000
SCHEMA = f"""
CREATE TABLE k (a int PRIMARY KEY, b text);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO k SELECT g, 'k' || g FROM generate_series(1, {ROWS}) g;
INSERT INTO bag SELECT g, 'b' || g FROM generate_series(1, {ROWS}) g;
CREATE PUBLICATION pub FOR TABLE k, bag;
"""


def one_row_each(conn: psycopg.Connection[Any], n: int) -> None:
    """One row into each table per autocommit transaction, every 7th also deletes from bag."""
    conn.execute("INSERT INTO k VALUES (%s, 'w')", [ROWS + n])
    conn.execute("INSERT INTO bag VALUES (%s, 'w')", [ROWS + n])
    if (ROWS + n) % 7 == 0:
        conn.execute(
            "DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE a = %s)", [ROWS + n - 3]
        )


def pace(n: int) -> float:
    """As fast as it can for the first ``FAST`` rows (through the copy and the catch-up),
    then 25 rows a second, so that the apply catches up in a bounded time."""
    return 0.0 if n <= FAST else 0.04


def all_ready(daemon: DaemonProcess) -> bool:
    if daemon.process.poll() is not None:
        raise AssertionError(f"pgsub exited with {daemon.process.returncode}:\n{daemon.logs()}")
    try:
        status, body = daemon.get("/status")
    except OSError:
        return False  # not serving yet
    if status != 200 or not body["subscriptions"]:
        return False
    tables = body["subscriptions"][0].get("tables") or []
    return len(tables) == 2 and all(t["state"] == "ready" for t in tables)


def test_copy_and_apply_under_saturating_load_lose_nothing(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    publisher.execute(SCHEMA)
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config,
        publisher,
        warehouse,
        copy_data=True,
        batch={"max_changes": 1000, "max_delay": "200ms"},
    )
    writer = Writer(publisher, one_row_each, pause=pace)
    writer.start()
    try:
        wait_until(lambda: writer.written >= 1000, timeout=60, what="the writer to start")
        daemon = daemons(config, port)
        wait_until(lambda: all_ready(daemon), timeout=400, interval=1, what="both tables READY")
        after_ready = writer.written
        wait_until(lambda: writer.written >= after_ready + 500, timeout=60, what="more writes")
    finally:
        writer.stop()
    wait_confirmed(publisher, timeout=600)
    assert daemon.terminate() == 0, daemon.logs()
    with publisher.connect() as conn:
        assert_delta_equals_publisher(
            conn, "public.k", spark, str(warehouse / "public" / "k"), ("a",)
        )
        assert_delta_equals_publisher(conn, "public.bag", spark, str(warehouse / "public" / "bag"))
    lost = [e for e in daemon.events() if "conflict" in str(e.get("event", ""))]
    assert not lost, lost[:3]
