"""``writer_processes: 2``: 20 small keyed tables under a writer, their batches merged in
writer processes (apply/delta/writer/merge_processes.py). The daemon is killed -9 after one
table's commit of a many-table batch: its writer processes go with it (the end of their
pipe), and the next daemon brings every table to the publisher's rows, read by Spark and
delta-rs, exactly once; stopped, it leaves no process behind. And ``auto``, the default: a
daemon of 1,000 tables (``AUTO_TABLES``) chooses two by itself."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import psycopg
import pytest

from apply.delta.writer.merge_processes import AUTO_TABLES, usable_cpus
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


MANY = [f"m{i}" for i in range(AUTO_TABLES)]


def many_step(conn: psycopg.Connection[Any], n: int) -> None:
    pick = random.Random(n)
    with conn.transaction():
        for table in pick.sample(MANY, 20):
            conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", [pick.randint(1, 5)])
            conn.execute(f"INSERT INTO {table} VALUES (%s, 'new', 0)", [10 + n])


def test_a_daemon_of_many_tables_chooses_writer_processes_by_itself(
    publisher: PgDatabase,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """``writer_processes`` left to its default (``auto``): a subscription of ``AUTO_TABLES``
    small tables on a local warehouse, on a machine with two usable cores, copies them with
    the threads and streams its changes through two writer processes, which take the tables
    over once up; every table equals the publisher's, read by delta-rs (none gained a reader
    feature), and no process outlives the daemon."""
    statements = [
        f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n int);"
        f"INSERT INTO {t} SELECT g, 'v', 0 FROM generate_series(1, 5) g"
        for t in MANY
    ]
    statements.append(f"CREATE PUBLICATION pub FOR TABLE {', '.join(MANY)}")
    publisher.execute(";".join(statements))
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, warehouse, copy_data=True, batch={"max_delay": "300ms"})
    expected = 2 if usable_cpus() >= 2 else 0
    with Writer(publisher, many_step, pause=0.02) as writer:
        daemon = daemons(config, port)
        wait_until(
            lambda: every_table_ready(daemon, len(MANY)), timeout=600, what="every table READY"
        )
        if expected:  # the processes up, the tables handed over: later writes are theirs
            wait_until(
                lambda: any(
                    e.get("event") == "tables written by writer processes" for e in daemon.events()
                ),
                timeout=300,
                what="the writer processes to take the tables over",
            )
        written = writer.written
        wait_until(lambda: writer.written >= written + 50, timeout=600, what="50 more writes")
        writer.stop()
        wait_confirmed(publisher, timeout=600)
        events = daemon.events()
        (chosen,) = [e for e in events if e.get("event") == "writer processes chosen"]
        assert (chosen["tables"], chosen["processes"]) == (len(MANY), expected), chosen
        taken = [e for e in events if e.get("event") == "tables written by writer processes"]
        assert len(taken) == (1 if expected else 0), daemon.logs()
        assert daemon.terminate() == 0, daemon.logs()
    wait_until(
        lambda: not group_commands(daemon.process.pid),
        timeout=60,
        what=f"the daemon's processes to exit: {group_commands(daemon.process.pid)}",
    )
    with publisher.connect() as conn:
        for table in MANY:
            want = conn.execute(f"SELECT id, v, n FROM {table} ORDER BY id").fetchall()
            delta = deltalake.DeltaTable(str(warehouse / "public" / table))
            assert not delta.protocol().reader_features, table  # every reader opens it
            got = delta.to_pyarrow_table().sort_by("id").to_pylist()
            assert [(r["id"], r["v"], r["n"]) for r in got] == want, table
