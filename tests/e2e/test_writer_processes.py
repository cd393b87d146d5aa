"""``writer_processes: 2``: 20 small keyed tables under a writer, their batches merged in
writer processes (apply/delta/writer/merge_processes.py). The daemon is killed -9 after one
table's commit of a many-table batch: its writer processes go with it (the end of their
pipe), and the next daemon brings every table to the publisher's rows, read by Spark and
delta-rs, exactly once; stopped, it leaves no process behind."""

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
    group_commands,
    wait_confirmed,
    write_config,
)
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.writer import Writer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TABLES = [f"k{i}" for i in range(20)]
ROWS = 100
STEPS = 200


def step(conn: psycopg.Connection[Any], n: int) -> None:
    pick = random.Random(n)
    with conn.transaction():
        for table in pick.sample(TABLES, 4):
            conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", [pick.randint(1, ROWS)])
            conn.execute(f"INSERT INTO {table} VALUES (%s, 'new', 0)", [ROWS + n])
            conn.execute(f"DELETE FROM {table} WHERE id = %s", [ROWS + n - 5])


def test_tables_merged_in_writer_processes_through_a_kill(
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    statements = []
    for table in TABLES:
        statements.append(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, n int)")
        statements.append(f"INSERT INTO {table} SELECT g, 'v', 0 FROM generate_series(1, {ROWS}) g")
    statements.append(f"CREATE PUBLICATION pub FOR TABLE {', '.join(TABLES)}")
    publisher.execute(";".join(statements))
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config,
        publisher,
        warehouse,
        copy_data=True,
        writer_processes=2,
        batch={"max_changes": 2000, "max_delay": "300ms"},
    )
    with Writer(publisher, step, pause=0.02) as writer:
        doomed = daemons(config, port, "apply.after_table_write=40")
        assert doomed.wait_exit(timeout=600) == -9, doomed.logs()
        started = [e for e in doomed.events() if e.get("event") == "writer process started"]
        assert len(started) == 2, doomed.logs()
        # Its writer processes (and the forkserver) see their pipe end and exit.
        wait_until(
            lambda: not group_commands(doomed.process.pid),
            timeout=60,
            what=f"the killed daemon's processes to exit: {group_commands(doomed.process.pid)}",
        )
        survivor = daemons(config, port)
        wait_until(lambda: writer.written >= STEPS, timeout=600, what=f"{STEPS} writes")
        writer.stop()
        wait_until(
            lambda: every_table_ready(survivor, len(TABLES)), timeout=600, what="every table READY"
        )
        wait_confirmed(publisher, timeout=600)
        assert survivor.terminate() == 0, survivor.logs()
    # The writer processes ended before the daemon did (``close``); the forkserver and
    # multiprocessing's resource tracker end as their pipe from it does, just after.
    wait_until(
        lambda: not group_commands(survivor.process.pid),
        timeout=60,
        what=f"the daemon's processes to exit: {group_commands(survivor.process.pid)}",
    )
    events = survivor.events()
    assert not [e for e in events if e.get("conflict")]  # replays are not conflicts
    assert not [e for e in events if e.get("event") == "writer process exited"]
    assert [e["processes"] for e in events if e.get("event") == "writer processes stopped"] == [2]
    with publisher.connect() as conn:
        for table in TABLES:
            path = str(warehouse / "public" / table)
            assert_delta_equals_publisher(conn, f"public.{table}", spark, path, ("id",))
