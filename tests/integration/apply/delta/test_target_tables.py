"""Target tables in states a crash or another hand can leave them in."""

from pathlib import Path
from typing import Any

import pytest

from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def test_a_table_whose_creation_was_cut_short_is_created_again(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """kill -9 inside Delta's CREATE leaves ``_delta_log/`` without a commit in it."""
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    log_dir = warehouse / "public" / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    (log_dir / ".00000000000000000000.json.0f1e.tmp").write_text("{")
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
    properties = spark.sql(f"DESCRIBE DETAIL delta.`{warehouse}/public/t`").first()["properties"]
    assert properties["pgsub.source"] == "public.t" and properties["pgsub.key"] == '["id"]'


def test_progress_is_found_behind_more_foreign_commits_than_the_peek(
    spark: Any, warehouse: Path
) -> None:
    """A piece's mark, then other writers' commits: the mark is still found (no repeat)."""
    from apply.batching.collapse import collapse
    from apply.columns.schema import target_schema
    from apply.core.batch import TableChange, TableWork
    from apply.core.records import CommitMark, Within
    from apply.delta.tables import DeltaTables
    from subscriber.replication.lsn import Lsn
    from tests.unit.apply.builders import ins, relation

    rel = relation("id", "v")
    tables = DeltaTables(spark, str(warehouse), "sub1")
    tables.history_peek = 2
    schema = target_schema(rel, lambda oid: None, keyed=True)
    tables.prepare(schema)
    net = collapse(TableWork(rel, [TableChange(0, ins(rel, 1, "a"))]))
    tables.write(schema, net, CommitMark("sub1", Lsn(0x100), 0))
    net = collapse(TableWork(rel, [TableChange(0, ins(rel, 2, "b"))]))
    tables.write(schema, net, CommitMark("sub1", Lsn(0x100), 0, Within(Lsn(0x500), 1)))
    for value in range(3):  # another writer
        spark.createDataFrame([(100 + value, "other")], "id int, v string").write.format(
            "delta"
        ).mode("append").save(tables.path("public.t"))
    assert tables.applied_lsn("public.t") == Lsn(0x100)
    assert tables.applied_within("public.t") == Within(Lsn(0x500), 1)


def test_tables_whose_names_once_shared_a_folder_replicate_apart(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        'CREATE SCHEMA "a.b"; CREATE SCHEMA a; CREATE SCHEMA "_pgsub";'
        'CREATE TABLE "a.b".c (id int PRIMARY KEY, v text);'
        'CREATE TABLE a."b.c" (id int PRIMARY KEY, v text);'
        'CREATE TABLE "_pgsub".checkpoints (id int PRIMARY KEY, v text);'
        'CREATE TABLE public."../../escape" (id int PRIMARY KEY, v text);'
        'CREATE PUBLICATION pub FOR TABLE "a.b".c, a."b.c", "_pgsub".checkpoints,'
        ' public."../../escape"'
    )
    names = ['"a.b".c', 'a."b.c"', "_pgsub.checkpoints", 'public."../../escape"']
    with Replication(publisher, spark, warehouse) as rep:
        for number, name in enumerate(names):
            publisher.execute(
                f"INSERT INTO {name} SELECT g, '{number}' FROM generate_series(1, 5) g"
            )
        rep.caught_up()
        for name in names:
            rep.assert_equal(name, key=("id",))
    folders = sorted(str(p.relative_to(warehouse)) for p in warehouse.glob("*/*"))
    assert "a~2Eb/c" in folders and "a/b~2Ec" in folders and "~5Fpgsub/checkpoints" in folders
    assert "public/~2E~2E~2F~2E~2E~2Fescape" in folders
    assert not (warehouse.parent / "escape").exists()


def test_a_renamed_or_deleted_table_stops_until_resync_copies_it_again(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    import shutil

    from subscriber.runtime import admin
    from subscriber.runtime.config import Config
    from tests.support.pgcluster import wait_until

    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 20) g;"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(publisher, spark, warehouse, copy_data=True) as rep:
        runner = rep.runner
        assert runner is not None
        config = Config(warehouse=str(warehouse), subscriptions=[rep.config])

        def state(name: str) -> str | None:
            found = [s for s in runner.coordinator.statuses if s.qualified_name == name]
            return found[0].state.label if found else None

        def copied(name: str) -> float:
            labels = {"subscription": "sub1", "relation": name}
            metric = "pgsub_tablesync_rows_copied_total"
            return rep.metrics.registry.get_sample_value(metric, labels) or 0.0

        def resync(table: str, now_named: str) -> None:
            # Not "READY left, then back": a small table's resync can pass between two polls.
            before = copied(now_named)
            admin.resync(config, rep.config, [table])
            wait_until(
                lambda: copied(now_named) > before and state(now_named) == "ready",
                timeout=180,
                what=f"{now_named} copied again and READY",
            )

        def failing_with(text: str) -> bool:
            return runner.status.state == "error" and text in (runner.status.last_error or "")

        wait_until(lambda: state("public.t") == "ready", timeout=180, what="t READY")
        publisher.execute("INSERT INTO t VALUES (21, 'x')")
        rep.caught_up()

        # Deleted by someone else: not recreated empty.
        shutil.rmtree(warehouse / "public" / "t")
        publisher.execute("UPDATE t SET v = 'after the delete' WHERE id = 1")
        wait_until(lambda: failing_with("is gone"), timeout=120, what="the deleted table's error")
        assert "pgsub resync -c <config> sub1 public.t" in (runner.status.last_error or "")
        assert not (warehouse / "public" / "t").exists()
        resync("public.t", "public.t")
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))

        # Renamed on the publisher: its changes do not start a new, empty table.
        publisher.execute("ALTER TABLE t RENAME TO t2; INSERT INTO t2 VALUES (22, 'renamed')")
        wait_until(lambda: failing_with("renamed to public.t2"), timeout=120, what="rename error")
        assert not (warehouse / "public" / "t2").exists()
        resync("public.t", "public.t2")
        rep.caught_up()
        rep.assert_equal("public.t2", key=("id",))


def _reader_features(path: Path) -> set[str]:
    """The reader features a Delta table's latest protocol action lists."""
    import json

    features: set[str] = set()
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            protocol = json.loads(line).get("protocol")
            if protocol is not None:
                features = set(protocol.get("readerFeatures") or ())
                if protocol["minReaderVersion"] == 2:  # the legacy protocol's own feature
                    features.add("columnMapping")
    return features


def test_tables_carry_only_the_reader_features_their_data_needs(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """Plain tables open in delta-rs; a name or a widening that needs a feature gains it."""
    from structlog.testing import capture_logs

    from tests.support.oracle import SPARK

    publisher.execute(
        "CREATE TABLE plain (id int PRIMARY KEY, n int, at timestamp, v text);"
        'CREATE TABLE odd (id int PRIMARY KEY, "a b" text);'
        "CREATE PUBLICATION pub FOR TABLE plain, odd"
    )
    with Replication(publisher, spark, warehouse) as rep, capture_logs() as logs:
        publisher.execute(
            "INSERT INTO plain SELECT g, g, '2024-01-01'::timestamp + g * interval '1 h', 'v'"
            " FROM generate_series(1, 20) g;"
            "INSERT INTO odd SELECT g, 'x' || g FROM generate_series(1, 5) g"
        )
        rep.caught_up()
        rep.assert_equal("public.plain", key=("id",))  # Spark and delta-rs
        rep.assert_equal("public.odd", key=("id",), readers=(SPARK,))
        assert _reader_features(warehouse / "public" / "plain") <= {"timestampNtz"}
        assert "columnMapping" in _reader_features(warehouse / "public" / "odd")

        # A widened column: the table is rewritten with the wider type (it is small), and
        # every reader still opens it; it used to gain typeWidening, which delta-rs refuses.
        publisher.execute(
            "ALTER TABLE plain ALTER COLUMN n TYPE bigint;"
            "INSERT INTO plain VALUES (21, 5000000000, NULL, 'wide')"
        )
        rep.caught_up()
        rep.assert_equal("public.plain", key=("id",))  # Spark and delta-rs
        assert _reader_features(warehouse / "public" / "plain") <= {"timestampNtz"}
        assert any(e["event"] == "target table rewritten to widen a column" for e in logs)
    gained = {
        (e["table"], e["feature"])
        for e in logs
        if e["event"] == "target table gains a reader feature"
    }
    assert gained == {("public.odd", "columnMapping")}


def test_a_column_of_a_table_past_the_rewrite_bound_is_widened_in_place(
    publisher: PgDatabase, spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``SCHEMA_REWRITE_MAX_BYTES`` a rewrite would cost what a copy costs: the column
    is widened in place with Delta's type widening, logged with the readers it excludes."""
    from structlog.testing import capture_logs

    from apply.delta.spark import definition
    from tests.support.oracle import SPARK

    monkeypatch.setattr(definition, "SCHEMA_REWRITE_MAX_BYTES", 0)
    publisher.execute(
        "CREATE TABLE big (id int PRIMARY KEY, n int); CREATE PUBLICATION pub FOR TABLE big"
    )
    with Replication(publisher, spark, warehouse) as rep, capture_logs() as logs:
        publisher.execute("INSERT INTO big SELECT g, g FROM generate_series(1, 20) g")
        rep.caught_up()
        publisher.execute(
            "ALTER TABLE big ALTER COLUMN n TYPE bigint; INSERT INTO big VALUES (21, 5000000000)"
        )
        rep.caught_up()
        rep.assert_equal("public.big", key=("id",), readers=(SPARK,))
    assert "typeWidening" in _reader_features(warehouse / "public" / "big")
    (gained,) = [e for e in logs if e["event"] == "target table gains a reader feature"]
    assert gained["feature"] == "typeWidening" and "delta-rs" in gained["excludes"]


def test_a_second_subscription_on_a_table_is_refused_unless_shared(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """Two publishers feed ``public.t``: the second subscription stops, naming the first,
    until ``shared_tables: true`` says it is meant (the multi-origin case)."""
    other = PgDatabase.create(publisher.cluster, "pub")
    schema = "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    try:
        publisher.execute(schema)
        other.execute(schema)
        with Replication(publisher, spark, warehouse, name="sa") as first:
            publisher.execute("INSERT INTO t VALUES (1, 'a')")
            first.caught_up()
            with Replication(other, spark, warehouse, name="sb") as second:
                other.execute("INSERT INTO t VALUES (2, 'b')")
                runner = second.runner
                assert runner is not None
                wait_until(
                    lambda: "written by subscription" in (runner.status.last_error or ""),
                    timeout=120,
                    what="the second subscription to be refused",
                )
                error = runner.status.last_error or ""
                assert '"sa"' in error and '"sb"' in error and "shared_tables: true" in error
            first.assert_equal("public.t", key=("id",))  # nothing of sb's
            with Replication(other, spark, warehouse, name="sb", shared_tables=True) as shared:
                shared.caught_up()
        rows = spark.read.format("delta").load(str(warehouse / "public" / "t")).collect()
        assert sorted((r["id"], r["v"]) for r in rows) == [(1, "a"), (2, "b")]
    finally:
        other.drop()


def test_a_staged_copy_lands_fresh_parts_whole_and_stale_ones_without_keys_read_again(
    spark: Any, warehouse: Path
) -> None:
    """What a copy on the executors stages (apply.delta.spark.staged_copy), run by local tasks."""
    import pyarrow as pa

    from apply.columns.schema import target_schema
    from apply.core.records import CommitMark
    from apply.delta.tables import DeltaTables
    from subscriber.replication.lsn import Lsn
    from tests.unit.apply.builders import relation

    tables = DeltaTables(spark, str(warehouse), "sub1")
    schema = target_schema(relation("id", "v"), lambda oid: None, keyed=True)
    tables.prepare(schema)

    def rows(ids: list[int], v: str) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int32()), "v": [f"{v}{i}" for i in ids]})

    parts = tables.staged_copy(schema)
    parts.stage(lambda: iter([rows([1, 2, 3], "old")]), "range-00000@1.1")
    parts.stage(lambda: iter([rows([9], "killed")]), "range-00001@1.1")  # never landed
    parts.stage(lambda: iter([rows([4, 5], "new"), rows([6], "new")]), "range-00001@1.2")
    parts.stage(lambda: iter([rows([2], "moved")]), "changed@1.2")
    parts.stage(lambda: iter([pa.table({"id": pa.array([2, 5], pa.int32())})]), "keys@1.2")
    parts.stage(lambda: iter([rows([4, 5], "again")]), "range-00001@1.2")  # replaces its part
    copied, version = parts.land(
        CommitMark("sub1", Lsn(0x100), 0),
        ["range-00000@1.1"],
        ["range-00001@1.2", "changed@1.2"],
        "keys@1.2",
    )
    table = spark.read.format("delta").load(tables.path("public.t"))
    landed = {r["id"]: r["v"] for r in table.collect()}
    assert landed == {1: "old1", 2: "moved2", 3: "old3", 4: "again4", 5: "again5"}
    assert copied == 5 and version is not None
    assert tables.applied_lsn("public.t") == Lsn(0x100)
    staging = Path(parts.path)
    assert list(staging.rglob("*.parquet"))
    parts.drop()
    assert not list(staging.rglob("*.parquet"))


def test_pgsub_and_delta_rs_create_the_table_spark_would_create(
    spark: Any, warehouse: Path
) -> None:
    """On a warehouse pgsub reaches, a table that needs no table feature is created without
    Spark: by pgsub's own first commit, or by delta-rs where a column needs a feature
    (``timestamp_ntz``) - the same schema, protocol and properties as Spark's CREATE TABLE."""
    from dataclasses import replace

    import deltalake

    from apply.columns import typemap as t
    from apply.columns.schema import TargetColumn, TargetSchema
    from apply.core.features import PORTABLE
    from apply.core.maintenance_policy import DEFAULT_POLICY
    from apply.delta.spark.definition import TableDefinition
    from apply.delta.writer.creation import Created

    scalars = [t.BOOL, t.INT2, t.INT4, t.INT8, t.FLOAT4, t.FLOAT8, t.BYTEA, t.DATE]
    scalars += [t.TIMESTAMP, t.TIMESTAMPTZ, t.TEXT, t.UUID, t.JSONB, t.INTERVAL, t.TIME]
    types = [t.ColumnType(oid) for oid in scalars]
    types += [
        t.ColumnType(t.NUMERIC, (12 << 16 | 3) + 4),  # numeric(12, 3)
        t.ColumnType(t.NUMERIC),
        t.ColumnType(t.INT4, is_array=True),
        t.ColumnType(t.TIMESTAMP, is_array=True),
        t.ColumnType(t.TEXT, is_array=True),
    ]
    columns = tuple(TargetColumn(f"c{i}", kind) for i, kind in enumerate(types))
    schema = TargetSchema("public.every", columns, ("c2",))
    definition = TableDefinition("sub1", PORTABLE, DEFAULT_POLICY, False, False, local=True)
    by_rs, by_spark = f"{warehouse}/by_rs", f"{warehouse}/by_spark"
    definition.create(spark, schema, by_rs)
    replace(definition, local=False).create(spark, schema, by_spark)
    definition.create(spark, schema, by_rs)  # IF NOT EXISTS: nothing happens

    assert deltalake.DeltaTable(by_rs).version() == 0
    made_by = deltalake.DeltaTable(by_rs).history()[0]["clientVersion"]
    assert made_by.startswith("delta-rs")

    def described(path: str) -> tuple[Any, ...]:
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
        fields = spark.read.format("delta").load(path).schema.jsonValue()
        return (
            fields,
            detail["minReaderVersion"],
            detail["minWriterVersion"],
            sorted(detail["tableFeatures"]),
            dict(detail["properties"]),
        )

    made_by_rs, made_by_spark = described(by_rs), described(by_spark)
    # Spark's upgrade to writer version 7 (timestampNtz) also names the legacy writer
    # features that version 2 implied; no table here uses them (no appendOnly property, no
    # invariant), and readers see the same reader features either way.
    legacy = {"appendOnly", "invariants"}
    assert set(made_by_spark[3]) - set(made_by_rs[3]) <= legacy
    assert made_by_rs[:3] + made_by_rs[4:] == made_by_spark[:3] + made_by_spark[4:]
    assert made_by_rs[4]["pgsub.key"] == '["c2"]'

    # Every type but timestamp (without time zone, in arrays too): version 1/2, pgsub's.
    plain = TargetSchema(
        "public.plain", tuple(c for c in columns if c.type.oid != t.TIMESTAMP), ("c2",)
    )
    ours, theirs = f"{warehouse}/plain_ours", f"{warehouse}/plain_spark"
    assert definition.create(spark, plain, ours) == Created(durable=True)  # not opened
    replace(definition, local=False).create(spark, plain, theirs)
    definition.create(spark, plain, ours)  # IF NOT EXISTS: nothing happens
    assert deltalake.DeltaTable(ours).version() == 0
    assert deltalake.DeltaTable(ours).history()[0]["clientVersion"] == "pgsub"
    assert described(ours) == described(theirs)
    assert described(ours)[1:3] == (1, 2)
    assert spark.sql(f"DESCRIBE HISTORY delta.`{ours}`").first()["operation"] == "CREATE TABLE"


@pytest.mark.parametrize("meanwhile", [False, True], ids=["", "another-commit-meanwhile"])
def test_a_copy_goes_on_from_the_table_delta_rs_created(
    spark: Any, warehouse: Path, tmp_path: Path, meanwhile: bool
) -> None:
    """A table with a ``timestamp`` column is created by delta-rs; its copy on the same
    thread writes into the table delta-rs opened then. Another writer's commit in between
    (``meanwhile``) is seen: the copy opens the table anew and lands over it."""
    import datetime

    import deltalake
    import pyarrow as pa

    from apply.batching.copy_source import CopySource
    from apply.columns import typemap as t
    from apply.columns.columnar import arrow_schema
    from apply.columns.schema import TargetColumn, TargetSchema
    from apply.core.records import CommitMark
    from apply.delta.tables import DeltaTables
    from subscriber.replication.lsn import Lsn

    columns = (
        TargetColumn("id", t.ColumnType(t.INT4)),
        TargetColumn("at", t.ColumnType(t.TIMESTAMP)),
    )
    schema = TargetSchema("public.t", columns, ("id",))
    tables = DeltaTables(spark, str(warehouse), "sub1")
    tables.prepare(schema)
    path = tables.path("public.t")
    assert deltalake.DeltaTable(path).history()[0]["clientVersion"].startswith("delta-rs")
    arrow = arrow_schema(columns)
    when = datetime.datetime(2026, 12, 1, 2, 0)
    if meanwhile:
        theirs = pa.table({"id": [99], "at": [when]}).cast(arrow)
        deltalake.write_deltalake(path, theirs, mode="append")
    block = pa.table({"id": [1, 2], "at": [when, None]}).cast(arrow)
    copied, _ = tables.copy_into(
        schema, CopySource.in_memory([block]), CommitMark("sub1", Lsn(100), 0), tmp_path
    )
    assert copied == 2
    rows = deltalake.DeltaTable(path).to_pyarrow_table().sort_by("id").to_pylist()
    assert rows == [{"id": 1, "at": when}, {"id": 2, "at": None}]
    assert tables.applied_lsn("public.t") == Lsn(100)
    assert deltalake.DeltaTable(path).version() == (2 if meanwhile else 1)


def test_a_created_and_copied_tables_own_commits_are_fsynced_once(
    spark: Any, warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pgsub's own first commit and its copy's commit are each fsynced once, before their
    names are linked, with the folders naming them; not read back and fsynced again as a
    commit another engine made would be (``Durability.settle``)."""

    import pyarrow as pa

    from apply.batching.copy_source import CopySource
    from apply.columns import typemap as t
    from apply.columns.columnar import arrow_schema
    from apply.columns.schema import TargetColumn, TargetSchema
    from apply.core.records import CommitMark
    from apply.delta.tables import DeltaTables
    from subscriber.replication.lsn import Lsn
    from tests.support.fsyncs import recorded_fsyncs

    columns = (TargetColumn("id", t.ColumnType(t.INT4)), TargetColumn("v", t.ColumnType(t.TEXT)))
    schema = TargetSchema("public.t", columns, ("id",))
    tables = DeltaTables(spark, str(warehouse), "sub1")
    synced = recorded_fsyncs(monkeypatch)
    tables.prepare(schema)
    block = pa.table({"id": [1, 2], "v": ["a", "b"]}).cast(arrow_schema(columns))
    tables.copy_into(
        schema, CopySource.in_memory([block]), CommitMark("sub1", Lsn(100), 0), tmp_path
    )
    log = str(warehouse / "public" / "t" / "_delta_log")
    for version in (0, 1):
        name = f"{version:020d}.json"
        assert sum(f.startswith(f"{log}/.{name}.") for f in synced) == 1, synced
        assert f"{log}/{name}" not in synced, synced  # read back and fsynced again
    data = [f for f in synced if f.endswith(".parquet")]
    assert len(data) == 1, synced
    assert log in synced and str(warehouse / "public" / "t") in synced
    assert tables.applied_lsn("public.t") == Lsn(100)


def test_a_restart_checks_an_unchanged_table_without_spark(spark: Any, warehouse: Path) -> None:
    """After a restart each table's first batch checks its schema and properties: read by
    delta-rs from a local table's log, with no Spark job, when nothing is to change; a
    column to add still goes through Spark."""
    from apply.columns.schema import Evolution, target_schema
    from apply.delta.spark.definition import TableDefinition
    from apply.delta.tables import DeltaTables
    from tests.unit.apply.builders import relation

    rel = relation("id", "v")
    tables = DeltaTables(spark, str(warehouse), "sub1")
    schema = target_schema(rel, lambda oid: None, keyed=True)
    tables.prepare(schema)
    restarted = DeltaTables(spark, str(warehouse), "sub1")
    definition: TableDefinition = restarted._definition
    no_spark: Any = None  # any Spark call fails
    path = restarted.path("public.t")
    assert definition.evolve(no_spark, schema, path) == Evolution()
    wider = target_schema(relation("id", "v", "w"), lambda oid: None, keyed=True)
    with pytest.raises(AttributeError):
        definition.evolve(no_spark, wider, path)  # a column to add: Spark's path
    evolution = restarted.prepare(wider)
    assert evolution is not None and [c.name for c in evolution.add] == ["w"]
    other = DeltaTables(spark, str(warehouse), "sub2")._definition
    with pytest.raises(AttributeError):  # another subscription's table: Spark's path refuses it
        other.evolve(no_spark, wider, path)


def test_delta_rs_spells_each_type_as_spark_does(spark: Any, warehouse: Path) -> None:
    """The columns delta-rs reads from a table's log, spelled as Spark's simpleString: what
    the check above compares with the wanted schema."""
    from apply.delta.writer.local_tables import described

    path = str(warehouse / "types")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (a int, b bigint, c smallint, d tinyint, e decimal(12,3),"
        " f double, g float, h boolean, i binary, j date, k timestamp, l timestamp_ntz,"
        " m string, n array<int>, o array<array<bigint>>, p map<string,bigint>) USING delta"
    )
    by_spark = {
        f.name: f.dataType.simpleString()
        for f in spark.read.format("delta").load(path).schema.fields
    }
    found = described(path)
    assert found is not None
    assert found[0] == by_spark
