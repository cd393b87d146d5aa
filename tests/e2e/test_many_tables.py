"""A database of 50 tables under a concurrent writer: copy, catch-up, streaming, kill -9.

What a real database asks of the apply path (docs/performance.md, "Many
tables"): every batch touches many tables, most of them small (merged by
delta-rs in the daemon, apply/delta/writer/local_merge.py), some keyless (Spark),
and large transactions arrive streamed. The daemon is killed once during the
copies and once after one table's commit of a many-table batch; the
survivor must bring every table to the publisher's rows, read by Spark and
by delta-rs, and confirm the slot to the end.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.daemon import (
    DaemonProcess,
    every_table_ready,
    wait_confirmed,
    write_config,
)
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.writer import Writer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

KEYED = 47
KEYLESS = 3  # through Spark's MERGE (apply/delta/spark/multiset.py): each costs seconds
STEPS = 300
LARGE = (150,)  # the steps that write a large transaction (streamed; staged by Spark)
ROWS = 200
TABLES = [f"k{i}" for i in range(KEYED)] + [f"bag{i}" for i in range(KEYLESS)]


def schema() -> str:
    statements = []
    for table in TABLES:
        key = " PRIMARY KEY" if table.startswith("k") else ""
        statements.append(f"CREATE TABLE {table} (id int{key}, v text, n int)")
        statements.append(
            f"INSERT INTO {table} SELECT g, 'v' || g, 0 FROM generate_series(1, {ROWS}) g"
        )
        if not key:
            statements.append(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    statements.append(f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    return ";".join(statements)


def step(conn: psycopg.Connection[Any], n: int) -> None:
    """A transaction over a few random tables; at the ``LARGE`` steps a large one over six
    tables (past logical_decoding_work_mem: streamed)."""
    pick = random.Random(n)
    with conn.transaction():
        if n in LARGE:
            for table in pick.sample(TABLES, 6):
                conn.execute(f"UPDATE {table} SET n = n + 1, v = v || '+' WHERE id % 3 = {n % 3}")
            return
        for table in pick.sample(TABLES, 3):
            row = pick.randint(1, ROWS)
            if table.startswith("k"):
                conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", [row])
                conn.execute(
                    f"INSERT INTO {table} VALUES (%s, 'new', 0) ON CONFLICT (id) DO NOTHING",
                    [ROWS + n],
                )
                conn.execute(f"DELETE FROM {table} WHERE id = %s", [ROWS + n - 7])
            else:
                conn.execute(f"INSERT INTO {table} VALUES (%s, 'new', 0)", [row])
                conn.execute(
                    f"DELETE FROM {table} WHERE ctid = (SELECT ctid FROM {table} "
                    "WHERE id = %s LIMIT 1)",
                    [row],
                )


def test_fifty_tables_copied_and_streamed_under_a_writer_through_two_kills(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    publisher.execute(schema())
    publisher.set_config("logical_decoding_work_mem", "64kB")
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config,
        publisher,
        warehouse,
        copy_data=True,
        max_sync_workers=4,
        streaming="on",
        spool_dir=str(tmp_path / "spool"),
        batch={"max_changes": 2000, "max_delay": "500ms"},
    )
    with Writer(publisher, step, pause=0.05) as writer:
        for failpoint in ("tablesync.after_copy_block=20", "apply.after_table_write=60"):
            doomed = daemons(config, port, failpoint)
            assert doomed.wait_exit(timeout=600) == -9, doomed.logs()
        survivor = daemons(config, port)
        wait_until(lambda: writer.written >= STEPS, timeout=600, what=f"{STEPS} writes")
        writer.stop()
        wait_until(
            lambda: every_table_ready(survivor, len(TABLES)), timeout=600, what="every table READY"
        )
        wait_confirmed(publisher, timeout=600)  # the slot confirmed to the end
        assert survivor.terminate() == 0, survivor.logs()
    events = survivor.events()
    assert not [e for e in events if e.get("conflict")]  # replays are not conflicts
    with publisher.connect() as conn:
        for table in TABLES:
            key = ("id",) if table.startswith("k") else ()
            path = str(warehouse / "public" / table)
            assert_delta_equals_publisher(conn, f"public.{table}", spark, path, key)
