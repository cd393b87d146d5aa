"""A copy staged by range, resumed under a later snapshot: what lands holds every row of that
snapshot exactly once, and nothing else but rows deleted since (the catch-up deletes them)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from apply.columns.schema import TargetSchema, target_schema
from subscriber.replication.catalog import PublisherCatalog
from subscriber.replication.commands import SnapshotAction
from subscriber.replication.stream import ReplicationConnection
from tablesync.copy import RangeReader, split
from tablesync.publication import PublishedTable, describe, published_tables
from tablesync.resume import (
    Manifest,
    RangeStage,
    landed_rows,
    layout,
    next_attempt,
    range_name,
    read_again,
    snapshot_facts,
)
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.integration

ROWS = 40_000


def published(publisher: PgDatabase) -> tuple[PublishedTable, TargetSchema, int]:
    with publisher.connect() as conn:
        (table,) = published_tables(conn, ["pub"])
        relation = describe(conn, table)
        blocks = table.heap_blocks(conn)
    catalog = PublisherCatalog(publisher.dsn)
    schema = target_schema(relation, catalog.type_row, keyed=True)
    catalog.close()
    return table, schema, blocks


def stage_ranges(stage: RangeStage, manifest: Manifest, read: RangeReader, indexes: range) -> None:
    for index in indexes:
        blocks = read(manifest.ranges[index])
        for _ in stage.stage(range_name(index), blocks, manifest.attempt):
            pass


def test_a_resumed_copy_lands_each_row_of_the_later_snapshot_once(
    publisher: PgDatabase, tmp_path: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        f"INSERT INTO t SELECT g, 'before' FROM generate_series(1, {ROWS}) g;"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    table, schema, blocks = published(publisher)
    stage = RangeStage(tmp_path / "16384")
    with ReplicationConnection(publisher.dsn) as exporting:
        slot = exporting.create_slot("resume", temporary=True, snapshot=SnapshotAction.EXPORT)
        read = RangeReader(publisher.dsn, slot.snapshot_name or "", table, schema)
        with psycopg.connect(publisher.dsn, autocommit=True) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(read.snapshot_literal))
            xmin, relation = snapshot_facts(conn, table.relid)
            conn.execute("COMMIT")
        ranges = tuple(split(blocks, 4))
        manifest = Manifest("resume", slot.consistent_point, xmin, relation, layout(schema), ranges)
        stage.begin(manifest)
        stage_ranges(stage, manifest, read, range(2))  # then the daemon dies: S1 is gone
    with publisher.connect() as conn:
        at_first = {r[0] for r in conn.execute("SELECT id FROM t")}
    # Changes while the daemon is down: rows of the staged ranges deleted, their space
    # reused by new versions of rows of the others, updates everywhere, keys changed,
    # and every row frozen.
    for statement in (
        "DELETE FROM t WHERE id <= 3000",
        "VACUUM t",
        "UPDATE t SET v = 'moved' WHERE id > 36000",
        "UPDATE t SET v = 'changed' WHERE id % 97 = 0",
        "UPDATE t SET id = id + 100000 WHERE id BETWEEN 5000 AND 5050",
        "INSERT INTO t SELECT g, 'new' FROM generate_series(200001, 201000) g",
        "DELETE FROM t WHERE id % 101 = 0",
        "VACUUM FREEZE t",  # a frozen row keeps its xmin: it still reads as changed
    ):
        publisher.execute(statement)
    with psycopg.connect(publisher.dsn, autocommit=True) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        exported = holder.execute("SELECT pg_catalog.pg_export_snapshot()").fetchone()
        assert exported is not None
        _, now_relation = snapshot_facts(holder, table.relid)
        assert now_relation == relation != ""  # no rewrite: the staged ranges are kept
        manifest = next_attempt(manifest)
        later = RangeReader(publisher.dsn, str(exported[0]), table, schema)
        stage_ranges(stage, manifest, later, range(2, 4))
        keys = read_again(stage, manifest, later, schema)
        current: dict[int, str] = dict(holder.execute("SELECT id, v FROM t").fetchall())
        holder.execute("COMMIT")
    # Fewer rows read again than the table holds: only what changed since S1.
    assert 0 < keys.num_rows < len(current) // 2
    landed = pa.concat_tables(list(landed_rows(stage, manifest, keys, schema.key))).to_pylist()
    ids = [r["id"] for r in landed]
    assert len(ids) == len(set(ids)), "a key landed twice"
    assert {r["id"]: r["v"] for r in landed if r["id"] in current} == current
    stale = set(ids) - current.keys()
    assert stale, "rows deleted since S1 that were staged should be there, for the catch-up"
    assert stale <= at_first - current.keys()


def test_a_rewritten_table_is_not_the_one_staged(publisher: PgDatabase) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'x' FROM generate_series(1, 1000) g;"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    table, _, _ = published(publisher)

    def relation() -> str:
        with psycopg.connect(publisher.dsn, autocommit=True) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            _, found = snapshot_facts(conn, table.relid)
            conn.execute("COMMIT")
        return found

    before = relation()
    assert before.startswith(f"{table.relid}:")
    publisher.execute("UPDATE t SET v = 'y'")
    publisher.execute("VACUUM t")
    assert relation() == before  # rows moved, the relation is the same
    for rewrite in ("VACUUM FULL t", "TRUNCATE t", "CLUSTER t USING t_pkey"):
        publisher.execute(rewrite)
        assert relation() != before, rewrite
        before = relation()


def test_a_partitioned_table_names_every_leaf(publisher: PgDatabase) -> None:
    publisher.execute(
        "CREATE TABLE p (id int PRIMARY KEY) PARTITION BY RANGE (id);"
        "CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100);"
        "CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (200);"
    )
    with psycopg.connect(publisher.dsn, autocommit=True) as conn:
        relid = conn.execute("SELECT 'p'::regclass::oid").fetchone()
        assert relid is not None
        _, relation = snapshot_facts(conn, int(relid[0]))
        assert len(relation.split(",")) == 2
        conn.execute("CREATE TABLE p3 PARTITION OF p FOR VALUES FROM (200) TO (300)")
        assert len(snapshot_facts(conn, int(relid[0]))[1].split(",")) == 3
