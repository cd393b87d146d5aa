"""Batches formed while the batch before is written (``apply.batching.forming``), against a real
publisher and real Delta tables."""

import json
from pathlib import Path
from typing import Any

import deltalake
import psycopg
import pytest
from structlog.testing import capture_logs

from subscriber.replication.names import table_folder
from tests.support.oracle import DELTA_RS, SPARK
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication
from tests.support.writer import Writer

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE keyed (id int PRIMARY KEY, v text, n int);
CREATE TABLE other (id int PRIMARY KEY, v text);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE keyed, other, bag;
"""


def one_change(conn: psycopg.Connection[Any], n: int) -> None:
    """A single-row transaction: updates, inserts, deletes and key changes over three tables."""
    key = n * 7919 % 500 + 1
    kind = n % 10
    if kind < 5:
        conn.execute("UPDATE keyed SET v = %s, n = n + 1 WHERE id = %s", [f"u{n}", key])
    elif kind == 5:
        conn.execute("DELETE FROM keyed WHERE id = %s", [key])
    elif kind == 6:
        conn.execute(
            "INSERT INTO keyed VALUES (%s, %s, 0) ON CONFLICT (id) DO UPDATE SET v = 'again'",
            [key, f"i{n}"],
        )
    elif kind == 7:
        conn.execute("UPDATE keyed SET id = id + 1000 WHERE id = %s", [key])
    elif kind == 8:
        conn.execute(
            "INSERT INTO other VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
            [key, f"o{n}"],
        )
    else:
        conn.execute("INSERT INTO bag VALUES (%s, %s)", [key, f"b{n}"])


def test_batches_formed_while_the_last_is_written_land_as_the_publisher_has_them(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """Single-row transactions keep arriving while batches are written: the next batch is
    split and collapsed as they arrive. A column added, a TRUNCATE and a table's first
    batch in the run fall back to the turn; the tables equal the publisher's either way."""
    publisher.execute(SCHEMA)
    settings: dict[str, Any] = {"batch": {"max_changes": 150, "max_delay": "50ms"}}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed SELECT g, 'v' || g, 0 FROM generate_series(1, 500) g")
        rep.caught_up()
        with capture_logs() as logs, Writer(publisher, one_change, pause=0.002) as writer:

            def formed() -> list[Any]:
                applied = [e for e in logs if e.get("event") == "batch applied"]
                return [e for e in applied if e["formed_ahead"]]

            wait_until(lambda: len(formed()) >= 5, timeout=120, what="batches formed ahead")
            publisher.execute("ALTER TABLE keyed ADD COLUMN w text")
            wait_until(lambda: writer.written >= 1200, timeout=120, what="1,200 transactions")
            publisher.execute("TRUNCATE bag")
            seen = len(formed())
            wait_until(lambda: len(formed()) >= seen + 5, timeout=120, what="formed again")
            writer.stop()
        rep.caught_up()
        rep.assert_equal("public.keyed", "public.other", key=("id",))
        rep.assert_equal("public.bag")
    applied = [e for e in logs if e.get("event") == "batch applied"]
    assert [e for e in applied if not e["formed_ahead"]], "some batches fell back to the turn"


MANY = [f"k{i}" for i in range(60)]  # a batch's writes outlast a look at what arrived


def one_of_many(conn: psycopg.Connection[Any], n: int) -> None:
    """A single-row transaction on one of ``MANY`` tables: an update, an insert or a delete,
    sometimes a key change."""
    table = MANY[n * 31 % len(MANY)]
    key = n * 7919 % 60 + 1
    kind = n % 8
    if kind < 4:
        conn.execute(f"UPDATE {table} SET v = %s, n = n + 1 WHERE id = %s", [f"u{n}", key])
    elif kind == 4:
        conn.execute(f"DELETE FROM {table} WHERE id = %s", [key])
    elif kind == 5:
        conn.execute(f"UPDATE {table} SET id = id + 100 WHERE id = %s", [key])
    else:
        conn.execute(
            f"INSERT INTO {table} VALUES (%s, %s, 0) ON CONFLICT (id) DO UPDATE SET v = 'again'",
            [key, f"i{n}"],
        )


def test_a_tables_write_takes_what_arrived_for_it_and_lands_as_the_publisher_has_it(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """Many tables, one writer: as each table's write of a batch starts it takes what has
    arrived for it since (docs/apply.md, "A table's write takes what has arrived for it"),
    and its commit carries an LSN past the batch's end. The flush is confirmed as writes
    end; every table equals the publisher's, read by delta-rs (and some by Spark), and no
    checkpoint row is recorded at a batch whose commits ran ahead of it."""
    statements = [
        f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n int);"
        f"INSERT INTO {t} SELECT g, 'v' || g, 0 FROM generate_series(1, 60) g"
        for t in MANY
    ]
    publisher.execute(
        ";".join([*statements, f"CREATE PUBLICATION pub FOR TABLE {', '.join(MANY)}"])
    )
    settings: dict[str, Any] = {
        "copy_data": True,
        "batch": {"max_delay": "20ms"},
        "checkpoint_interval": 2,
    }
    with Replication(publisher, spark, warehouse, **settings) as rep:
        rep.caught_up()
        with capture_logs() as logs, Writer(publisher, one_of_many, pause=0.001) as writer:

            def ran_ahead() -> list[Any]:
                applied = [e for e in logs if e.get("event") == "batch applied"]
                return [e for e in applied if e["taken_ahead"]]

            # A write takes only what a look (every 50 ms) moved into the forming batch before
            # it started; when batches are as short as a look, most find it empty (a failing run
            # under load: 41 takes of 6,861 asked, in 300 batches of 0.01-0.2 s), so the test
            # asks for batches that took, not for a count of them.
            wait_until(lambda: len(ran_ahead()) >= 3, timeout=180, what="writes that took ahead")
            wait_until(lambda: writer.written >= 1500, timeout=180, what="1,500 transactions")
            writer.stop()
        rep.caught_up()
        # Every table by delta-rs; a few by Spark too (a Spark read is about a second each).
        rep.assert_equal(*(f"public.{t}" for t in MANY), key=("id",), readers=(DELTA_RS,))
        rep.assert_equal(*(f"public.{t}" for t in MANY[:5]), key=("id",), readers=(SPARK,))
    # Each checkpoint row is one consistent point: no table's version holds a transaction
    # past the row's LSN (each commit's idempotent-write version is the LSN it reached).
    # And each table's version as of a row (its own, else an earlier row's) is its last
    # that reached no further: no later commit of the subscription reached the row's LSN
    # (a version that took ahead, left out of the rows, would leave a stale one).
    rows = deltalake.DeltaTable(str(warehouse / "_pgsub" / "checkpoints")).to_pyarrow_table()
    assert rows.num_rows >= 2
    recorded: dict[str, int] = {}
    commits: dict[str, dict[int, int]] = {}
    by_lsn = sorted(zip(rows["lsn"].to_pylist(), rows["tables"].to_pylist(), strict=True))
    for lsn, tables in by_lsn:
        recorded.update(dict(tables))
        for table, version in recorded.items():
            if table not in commits:
                commits[table] = _reached(warehouse, table)
            reached = commits[table]
            assert version in reached and reached[version] <= lsn, (table, version, lsn)
            later = [v for v, at in reached.items() if v > version and at <= lsn]
            assert not later, (table, version, lsn, later)


def _reached(warehouse: Path, table: str) -> dict[int, int]:
    """Each commit of ``table`` that carries an idempotent-write version: the LSN it reached."""
    reached = {}
    for commit in (warehouse / table_folder(table) / "_delta_log").glob("*.json"):
        actions = [json.loads(line) for line in commit.open()]
        txns = [a["txn"]["version"] for a in actions if "txn" in a]
        if txns:
            reached[int(commit.stem)] = txns[0]
    return reached
