"""The initial copy in CTID ranges, each read on its own connection under the sync slot's
exported snapshot: every row the snapshot sees exactly once, nothing written after it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from apply.columns.schema import target_schema
from subscriber.replication.catalog import PublisherCatalog
from subscriber.replication.commands import SnapshotAction
from subscriber.replication.stream import ReplicationConnection
from tablesync.copy import CopySettings, RangeReader, parallel, range_count, split
from tablesync.publication import describe, published_tables
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication
from tests.support.writer import Writer

pytestmark = pytest.mark.integration


def test_ranges_read_every_row_of_the_snapshot_once(publisher: PgDatabase) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'before' FROM generate_series(1, 30000) g;"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    with publisher.connect() as conn:
        (table,) = published_tables(conn, ["pub"])
        relation = describe(conn, table)
        blocks = table.heap_blocks(conn)
    catalog = PublisherCatalog(publisher.dsn)
    schema = target_schema(relation, catalog.type_row, keyed=True)
    catalog.close()
    assert blocks > 100
    ranges = split(blocks, 7)
    with ReplicationConnection(publisher.dsn) as exporting:
        slot = exporting.create_slot("ranges", temporary=True, snapshot=SnapshotAction.EXPORT)
        assert slot.snapshot_name
        # Committed after the snapshot: updates move rows into other blocks, and new rows
        # land in blocks past the size read above. None of it may be copied.
        publisher.execute(
            "UPDATE t SET v = 'after' WHERE id % 3 = 0;"
            "DELETE FROM t WHERE id % 5 = 0;"
            "INSERT INTO t SELECT g, 'after' FROM generate_series(30001, 40000) g"
        )
        read = RangeReader(publisher.dsn, slot.snapshot_name, table, schema)
        rows = [r for block in parallel(read, ranges, readers=3) for r in block.to_pylist()]
    assert len(rows) == 30000
    assert sorted(r["id"] for r in rows) == list(range(1, 30001))
    assert {r["v"] for r in rows} == {"before"}
    assert "password" not in repr(read) and publisher.dsn not in repr(read)


def test_a_failed_range_stops_the_copy_with_its_error(publisher: PgDatabase) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY);"
        "INSERT INTO t SELECT generate_series(1, 5000);"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    catalog = PublisherCatalog(publisher.dsn)
    with publisher.connect() as conn:
        (table,) = published_tables(conn, ["pub"])
        schema = target_schema(describe(conn, table), catalog.type_row, keyed=True)
        ranges = split(table.heap_blocks(conn), 4)
    catalog.close()
    read = RangeReader(publisher.dsn, "00000003-0000001B-1", table, schema)  # no such snapshot
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="snapshot"):
        list(parallel(read, ranges, readers=2))


def test_range_count_follows_the_heap() -> None:
    assert range_count(0, 64 << 20, None) == 1
    assert range_count(8192, 64 << 20, None) == 1  # 64 MiB
    assert range_count(8193, 64 << 20, None) == 2
    assert range_count(100, 64 << 20, 4) == 4
    assert range_count(3, 64 << 20, 8) == 3  # never an empty range by construction
    # One reader on a local Spark: PostgreSQL's one COPY, unless a number is set.
    assert CopySettings().ranges_for(100_000, on_executors=False) == 1
    assert CopySettings().ranges_for(100_000, on_executors=True) == 13  # 800 MB / 64 MiB
    assert CopySettings(readers=2).ranges_for(100_000, on_executors=False) == 13
    assert CopySettings(ranges=3).ranges_for(100_000, on_executors=False) == 3
    covered = split(1001, 7)
    assert covered[0].first == 0 and covered[-1].stop is None
    assert all(a.stop == b.first for a, b in itertools.pairwise(covered))


def test_copy_in_ranges_under_a_write_workload(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """A keyed table whose rows move between ranges while it is copied, a table without a
    key (a row read twice would be a duplicate) and a partitioned table with a row filter."""
    publisher.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v text);"
        "CREATE TABLE c (x int, y text);"
        "CREATE TABLE p (id int, region text, PRIMARY KEY (id, region))"
        "  PARTITION BY LIST (region);"
        "CREATE TABLE p_eu PARTITION OF p FOR VALUES IN ('eu');"
        "CREATE TABLE p_us PARTITION OF p FOR VALUES IN ('us');"
        "INSERT INTO a SELECT g, repeat('v', 40) FROM generate_series(1, 40000) g;"
        "INSERT INTO c SELECT g % 7, 'c' FROM generate_series(1, 20000) g;"
        "INSERT INTO p SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END"
        "  FROM generate_series(1, 20000) g;"
        "CREATE PUBLICATION pub FOR TABLE a, c, p WHERE (region = 'eu')"
        "  WITH (publish_via_partition_root = true)"
    )

    def step(conn: psycopg.Connection[Any], n: int) -> None:
        conn.execute("UPDATE a SET v = v || '.' WHERE id = %s", [(n * 7919) % 40000 + 1])
        conn.execute("INSERT INTO c VALUES (%s, 'w')", [n])
        conn.execute("UPDATE p SET id = id + 100000 WHERE id = %s", [n % 20000 + 1])

    with (
        capture_logs() as logs,
        Writer(publisher, step, pause=0.005) as writer,
        Replication(
            publisher, spark, warehouse, copy_data=True, copy={"ranges": 4, "readers": 2}
        ) as rep,
    ):
        wait_until(rep.all_ready, timeout=300, what="every table to be READY")
        writer.stop()
        rep.caught_up()
        rep.assert_equal("public.a", key=("id",))
        rep.assert_equal("public.c")
        with publisher.connect() as conn:
            eu = conn.execute("SELECT id FROM p WHERE region = 'eu' ORDER BY id").fetchall()
        assert sorted(r["id"] for r in rep.rows("public.p")) == [r[0] for r in eu]
        assert {r["region"] for r in rep.rows("public.p")} == {"eu"}
    started = {e["table"]: e for e in logs if e["event"] == "table copy started"}
    assert {t: e["ranges"] for t, e in started.items()} == {
        "public.a": 4,
        "public.c": 4,
        "public.p": 4,
    }
    assert {e["read_by"] for e in started.values()} == {"pgsub"}
