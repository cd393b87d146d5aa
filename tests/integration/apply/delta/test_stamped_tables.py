"""``history: soft_delete``: a mirror whose deleted rows stay, marked with the LSN and time of
their delete, through the copy, inserts, updates (unchanged TOAST, a key change), deletes, a
deleted key inserted again, a TRUNCATE, update_missing against a marked row, and a resync;
another table of the same subscription stays a plain mirror. Read back by delta-rs (not
Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apply.history.changelog import COMMIT_TIME, LSN
from apply.history.stamps import DELETED
from subscriber.runtime import admin
from subscriber.runtime.config import Config
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE t (id int PRIMARY KEY, v text, big text);
CREATE TABLE u (id int PRIMARY KEY, v text);
INSERT INTO t SELECT 1, 'one', string_agg(md5(g::text), '') FROM generate_series(1, 400) g;
INSERT INTO t VALUES (2, 'two', NULL), (10, 'ten', NULL);
INSERT INTO u VALUES (1, 'one');
CREATE PUBLICATION pub FOR TABLE t, u
"""

BIG = "".join(__import__("hashlib").md5(str(g).encode()).hexdigest() for g in range(1, 401))


def rows(path: str) -> dict[int, dict[str, Any]]:
    """The table as delta-rs reads it, by id."""
    import deltalake

    return {r["id"]: r for r in deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()}


def merged_by(path: str) -> set[str]:
    """The engines of the table's MERGE commits (``delta-rs``, ``Apache-Spark``)."""
    import deltalake

    infos = deltalake.DeltaTable(path).history()
    return {
        str(c.get("engineInfo")).split(":")[0].split("/")[0]
        for c in infos
        if c.get("operation") == "MERGE"
    }


def state(path: str) -> dict[int, tuple[str | None, bool]]:
    return {i: (r["v"], r[DELETED]) for i, r in rows(path).items()}


def current_lsn(publisher: PgDatabase) -> int:
    """Where the publisher's next WAL record goes: past every commit so far."""
    with publisher.connect() as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("written_by", ["delta-rs", "spark"])
def test_a_soft_delete_table_keeps_deleted_rows_marked(
    publisher: PgDatabase, spark: Any, warehouse: Path, written_by: str
) -> None:
    """Merged by delta-rs on a local warehouse; by Spark where delta-rs may not write the
    table (here: Delta's change data feed on, as a remote warehouse would)."""
    publisher.execute(SCHEMA)
    features = {"change_data_feed": written_by == "spark"}
    with Replication(
        publisher,
        spark,
        warehouse,
        copy_data=True,
        history={"tables": {"public.t": "soft_delete"}},
        table_features=features,
        batch={"max_delay": "300ms"},
    ) as rep:
        rep.caught_up()
        path = rep.path("public.t")
        copied = rows(path)
        assert state(path) == {1: ("one", False), 2: ("two", False), 10: ("ten", False)}
        copy_lsn = copied[1][LSN]
        assert all(r[LSN] == copy_lsn and r[COMMIT_TIME] is None for r in copied.values())

        publisher.execute("INSERT INTO t VALUES (3, 'three')")
        rep.caught_up()  # a row inserted and deleted within one batch leaves none
        publisher.execute("UPDATE t SET v = 'uno' WHERE id = 1")  # big: unchanged TOAST
        publisher.execute("UPDATE t SET id = 20 WHERE id = 2")  # 2 gone, 20 there
        before_deletes = current_lsn(publisher)
        publisher.execute("DELETE FROM t WHERE id = 3")
        rep.caught_up()
        publisher.execute("DELETE FROM t WHERE id = 10")
        rep.caught_up()
        publisher.execute("INSERT INTO t VALUES (10, 'ten again')")  # a deleted key back
        rep.caught_up()
        got = rows(path)
        assert state(path) == {
            1: ("uno", False),
            2: ("two", True),
            3: ("three", True),
            10: ("ten again", False),
            20: ("two", False),
        }
        assert got[1]["big"] == BIG  # kept from the target: the update did not send it
        assert got[3][LSN] > before_deletes >= got[2][LSN] > copy_lsn
        assert got[10][LSN] > got[3][LSN]
        assert merged_by(path) == {"delta-rs" if written_by == "delta-rs" else "Apache-Spark"}
        assert all(got[i][COMMIT_TIME] is not None for i in (2, 3, 10, 20))
        rep.assert_equal("public.u", key=("id",))  # the other table stays a plain mirror

        publisher.execute("ALTER TABLE t DROP COLUMN big")  # kept in Delta, with its values
        before_truncate = current_lsn(publisher)
        publisher.execute("BEGIN; TRUNCATE t; INSERT INTO t VALUES (5, 'five'); COMMIT")
        rep.caught_up()
        publisher.execute("INSERT INTO t VALUES (1, 'back')")  # after the TRUNCATE: alive
        rep.caught_up()
        after = rows(path)
        assert state(path) == {
            1: ("back", False),
            2: ("two", True),
            3: ("three", True),
            5: ("five", False),
            10: ("ten again", True),
            20: ("two", True),
        }
        truncated_at = after[10][LSN]
        assert truncated_at > before_truncate and after[20][LSN] == truncated_at
        assert after[5][LSN] == truncated_at  # the same transaction
        assert after[2][LSN] == got[2][LSN] and after[3][LSN] == got[3][LSN]  # deleted before
        assert after[1]["big"] == BIG and after[1][LSN] > truncated_at  # the marked row's
        with publisher.connect() as conn:
            published = dict(conn.execute("SELECT id, v FROM t").fetchall())
        alive = {i: r["v"] for i, r in after.items() if not r[DELETED]}
        assert alive == published

        # A row the target has deleted is missing: the publisher's update of it is skipped.
        spark.sql(f"UPDATE delta.`{path}` SET {DELETED} = true WHERE id = 5")
        publisher.execute("UPDATE t SET v = 'cinq' WHERE id = 5")
        publisher.execute("INSERT INTO t VALUES (6, 'six')")
        labels = {"subscription": "sub1", "relation": "public.t", "type": "update_missing"}
        wait_until(
            lambda: rep.metrics.registry.get_sample_value("pgsub_conflicts_total", labels) == 1,
            timeout=120,
            what="update_missing reported",
        )
        rep.caught_up()
        assert state(path)[5] == ("five", True) and state(path)[6] == ("six", False)

        # A resync copies the table again: the rows the publisher has, alive; the rows it
        # marked deleted stay; a row the copy lacks (another writer's) is marked at its LSN.
        spark.sql(f"INSERT INTO delta.`{path}` (id, v, {DELETED}) VALUES (99, 'stray', false)")
        marked = rows(path)
        config = Config(warehouse=str(warehouse), subscriptions=[rep.config])
        admin.resync(config, rep.config, ["public.t"])
        resynced = {
            1: ("back", False),
            2: ("two", True),
            3: ("three", True),
            5: ("cinq", False),
            6: ("six", False),
            10: ("ten again", True),
            20: ("two", True),
            99: ("stray", True),
        }
        wait_until(lambda: state(path) == resynced, timeout=120, what="the resync's copy")
        again = rows(path)
        copy_lsn = again[1][LSN]
        assert copy_lsn > marked[6][LSN] and again[5][LSN] == again[6][LSN] == copy_lsn
        assert again[99][LSN] == copy_lsn and again[99][COMMIT_TIME] is None
        assert all(again[i][LSN] == marked[i][LSN] for i in (2, 3, 10, 20))  # deleted before


@pytest.mark.parametrize("written_by", ["delta-rs", "spark"])
def test_metadata_columns_stamp_each_row_of_a_mirror_with_its_last_write(
    publisher: PgDatabase, spark: Any, warehouse: Path, written_by: str
) -> None:
    """``history.metadata_columns``: turned on for a mirror that exists (its rows before have
    no stamp), then every write stamps its rows; deletes delete; a keyless table stays
    plain."""
    publisher.execute(SCHEMA + "; CREATE TABLE bag (a int, b text)")
    publisher.execute("ALTER TABLE bag REPLICA IDENTITY FULL; ALTER PUBLICATION pub ADD TABLE bag")
    features = {"change_data_feed": written_by == "spark"}
    with Replication(publisher, spark, warehouse, copy_data=True, table_features=features) as rep:
        rep.caught_up()
    stamped = {"metadata_columns": True}
    with Replication(
        publisher,
        spark,
        warehouse,
        history=stamped,
        table_features=features,
        batch={"max_delay": "300ms"},
    ) as rep:
        path = rep.path("public.t")
        before = current_lsn(publisher)
        publisher.execute("UPDATE t SET v = 'uno' WHERE id = 1")  # big: unchanged TOAST
        publisher.execute("INSERT INTO bag VALUES (1, 'x')")
        rep.caught_up()
        got = rows(path)
        assert got[1][LSN] > before and got[1][COMMIT_TIME] is not None
        assert got[1]["big"] == BIG
        assert got[2][LSN] is None and got[10][LSN] is None  # written before the columns
        publisher.execute("UPDATE t SET id = 20 WHERE id = 2")
        publisher.execute("DELETE FROM t WHERE id = 10")
        rep.caught_up()
        got = rows(path)
        assert sorted(got) == [1, 20] and got[20][LSN] > got[1][LSN]
        assert merged_by(path) == {"delta-rs" if written_by == "delta-rs" else "Apache-Spark"}
        publisher.execute("BEGIN; TRUNCATE t; INSERT INTO t VALUES (5, 'five'); COMMIT")
        publisher.execute("INSERT INTO t VALUES (6, 'six')")
        rep.caught_up()
        got = rows(path)
        assert {i: r["v"] for i, r in got.items()} == {5: "five", 6: "six"}
        assert got[6][LSN] > got[5][LSN] > before
        assert DELETED not in got[5]
        import deltalake

        bag = deltalake.DeltaTable(rep.path("public.bag")).to_pyarrow_table()
        assert bag.column_names == ["a", "b"] and bag.num_rows == 1
