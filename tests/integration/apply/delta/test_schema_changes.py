"""Schema changes at their LSN: with `pgsub publisher-setup`'s event triggers installed, a
column renamed, dropped and retyped on the publisher is renamed, dropped and retyped in the
Delta table at that point in the stream (changes before and after it in one batch each land
in the right column); without them, the column list is guessed as before. Read back by
delta-rs (not Spark) and by Spark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apply.delta.spark.ddl import kept_name
from apply.schema_changes.ddl import SchemaChange, publisher_setup_sql
from subscriber.replication.lsn import Lsn
from subscriber.runtime import admin
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, a text, b int, c int);
INSERT INTO t SELECT g, 'a' || g, g, g * 10 FROM generate_series(1, 5) g;
CREATE PUBLICATION pub FOR TABLE t
"""


def delta_rs_rows(path: str) -> dict[int, dict[str, Any]]:
    import deltalake

    return {r["id"]: r for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


def published(publisher: PgDatabase) -> dict[int, tuple[Any, ...]]:
    with publisher.connect() as conn:
        return {r[0]: r for r in conn.execute("SELECT id, aa, c FROM t").fetchall()}


def test_a_rename_a_drop_and_a_type_change_are_followed_at_their_lsn(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(SCHEMA)
    with Replication(publisher, spark, warehouse, copy_data=True, batch={"max_delay": "2s"}) as rep:
        admin.publisher_setup(rep.config)
        rep.caught_up()
        path = rep.path("public.t")
        # One batch: an update before the rename, the rename, an update after it.
        publisher.execute("UPDATE t SET a = 'before' WHERE id = 1")
        publisher.execute("ALTER TABLE t RENAME COLUMN a TO aa")
        publisher.execute("UPDATE t SET aa = 'after' WHERE id = 2")
        rep.caught_up()
        rows = delta_rs_rows(path)
        assert "a" not in rows[1] and rows[1]["aa"] == "before" and rows[2]["aa"] == "after"
        assert rows[3]["aa"] == "a3"  # a row no change wrote since: renamed with its column

        publisher.execute("ALTER TABLE t DROP COLUMN b")
        at = Lsn.parse(publisher.fetchval("SELECT pg_current_wal_insert_lsn()::text"))
        publisher.execute("ALTER TABLE t ALTER COLUMN c TYPE text")  # int to text: no widening
        publisher.execute("INSERT INTO t VALUES (6, 'six', 'sixty')")
        rep.caught_up()
        rows = delta_rs_rows(path)
        assert "b" not in rows[1]  # a mirror drops it
        assert rows[6]["c"] == "sixty" and rows[1]["c"] == "10"  # cast as PostgreSQL casts
        kept = [name for name in rows[1] if name.startswith("_pgsub_c_before_")]
        assert len(kept) == 1 and rows[1][kept[0]] == 10 and rows[6][kept[0]] is None
        assert int(kept[0].rsplit("_", 1)[1], 16) > int(at)
        rep.assert_equal("public.t", key=("id",))  # the publisher's columns, both readers

        # A default every row took, which the publisher never sends: in Delta too.
        publisher.execute("ALTER TABLE t ADD COLUMN d numeric(6, 2) DEFAULT 7.25")
        publisher.execute("INSERT INTO t VALUES (7, 'seven', 'seventy', 1.5)")
        rep.caught_up()
        rows = delta_rs_rows(path)
        assert str(rows[1]["d"]) == "7.25" and str(rows[7]["d"]) == "1.50"
        rep.assert_equal("public.t", key=("id",))


def test_without_the_triggers_the_column_list_is_guessed(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """As before the triggers: a renamed column is a new one, the old kept with its values
    (and the guess logged); a dropped one is kept; a type change Delta cannot widen stops the
    apply with an error naming the resync."""
    from structlog.testing import capture_logs

    publisher.execute(SCHEMA)
    with Replication(publisher, spark, warehouse, copy_data=True) as rep:
        publisher.execute("UPDATE t SET a = 'one' WHERE id = 1")  # the columns before
        rep.caught_up()
        with capture_logs() as logs:
            publisher.execute("ALTER TABLE t RENAME COLUMN a TO aa")
            publisher.execute("ALTER TABLE t DROP COLUMN b")
            publisher.execute("UPDATE t SET aa = 'after' WHERE id = 2")
            rep.caught_up()
        guesses = [e for e in logs if e["event"].startswith("columns dropped and added")]
        assert [(g["dropped"], g["added"]) for g in guesses] == [(["a", "b"], ["aa"])]
        rows = delta_rs_rows(rep.path("public.t"))
        assert rows[2]["aa"] == "after" and rows[3]["aa"] is None and rows[3]["a"] == "a3"
        assert rows[3]["b"] == 3  # kept

        publisher.execute("ALTER TABLE t ALTER COLUMN c TYPE text")
        publisher.execute("UPDATE t SET c = 'x' WHERE id = 1")
        runner = rep.runner
        assert runner is not None
        wait_until(
            lambda: "pgsub resync" in (runner.status.last_error or ""),
            timeout=120,
            what="the type change's error",
        )
        assert "column 'c' of public.t changed type" in (runner.status.last_error or "")


def test_the_setup_sql_never_stands_in_the_way_of_the_publisher_ddl(
    publisher: PgDatabase,
) -> None:
    """Installed twice (an update); an ALTER TABLE of a table no publication has emits
    nothing; one of a partitioned table whose partitions are published announces them."""
    publisher.execute(
        SCHEMA + "; CREATE TABLE p (id int, a text) PARTITION BY RANGE (id);"
        " CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100);"
        " CREATE PUBLICATION leaves FOR TABLE p"
    )
    publisher.execute(publisher_setup_sql())
    publisher.execute(publisher_setup_sql())
    publisher.execute("SELECT pg_create_logical_replication_slot('ddl', 'test_decoding')")
    publisher.execute("CREATE TABLE other (x int); ALTER TABLE other ADD COLUMN y int")
    publisher.execute("ALTER TABLE t ADD COLUMN d int")
    publisher.execute("ALTER TABLE p RENAME COLUMN a TO aa")
    announced: list[tuple[str, str]] = []

    def messages() -> bool:  # decoded once flushed (synchronous_commit may be off)
        with publisher.connect() as conn:
            rows = conn.execute(
                "SELECT data FROM pg_logical_slot_get_changes('ddl', NULL, NULL)"
            ).fetchall()
        for (data,) in rows:
            if "pgsub-ddl" in data:
                body = json.loads(data.split("content:", 1)[1])
                announced.append((body["table"], body["event"]))
        return ("p1", "after") in announced

    wait_until(messages, timeout=30, what="the triggers' messages")
    # "before": each published table the statement names (p for p1); "after": what changed.
    assert announced == [("t", "before"), ("t", "after"), ("p1", "before"), ("p1", "after")]
    assert kept_name("c", SchemaChange("public.t", 1, Lsn(0x16B3A80))) == "_pgsub_c_before_16b3a80"


def test_a_table_with_column_mapping_renames_and_drops_in_its_metadata(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """`column_mapping: always` (readers that allow it): no rewrite, Delta's own RENAME
    COLUMN and DROP COLUMN; a change log keeps a dropped column with its values."""
    publisher.execute(SCHEMA + "; CREATE TABLE log (id int PRIMARY KEY, a text, b int)")
    publisher.execute("INSERT INTO log VALUES (1, 'one', 1); ALTER PUBLICATION pub ADD TABLE log")
    with Replication(
        publisher,
        spark,
        warehouse,
        copy_data=True,
        table_features={"column_mapping": "always"},
        history={"tables": {"public.log": "changelog"}},
    ) as rep:
        admin.publisher_setup(rep.config)
        rep.caught_up()
        publisher.execute("ALTER TABLE t RENAME COLUMN a TO aa; ALTER TABLE t DROP COLUMN b")
        publisher.execute("ALTER TABLE log RENAME COLUMN a TO aa; ALTER TABLE log DROP COLUMN b")
        publisher.execute("UPDATE t SET aa = 'after' WHERE id = 2")
        publisher.execute("INSERT INTO log VALUES (2, 'two')")
        rep.caught_up()
        path = rep.path("public.t")
        operations = [
            r["operation"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        ]
        assert "RENAME COLUMN" in operations and "DROP COLUMNS" in operations
        assert "WRITE" not in operations[: operations.index("RENAME COLUMN")]  # no rewrite
        rep.assert_equal("public.t", key=("id",), readers=("spark",))
        logged = spark.read.format("delta").load(rep.path("public.log"))
        assert {"aa", "b"} <= set(logged.columns) and "a" not in logged.columns
        values = {(r["aa"], r["b"]) for r in logged.collect() if r["_pgsub_op"] != "truncate"}
        assert values == {("one", 1), ("two", None)}  # the drop kept the column's history
