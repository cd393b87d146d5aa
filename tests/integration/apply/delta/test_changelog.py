"""``history: changelog``: a table kept as an append-only log of every change, in commit
order, through the copy, inserts, updates (unchanged TOAST, a key change), deletes, a
TRUNCATE and a resync; another table of the same subscription stays a mirror. Read back by
delta-rs (not Spark) and by Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apply.history.changelog import LSN, OP, SEQ
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
INSERT INTO t VALUES (2, 'two', NULL);
INSERT INTO u VALUES (1, 'one');
CREATE PUBLICATION pub FOR TABLE t, u
"""

WORKLOAD = [
    "INSERT INTO t VALUES (3, 'three')",
    "UPDATE t SET v = 'uno' WHERE id = 1",  # big is TOASTed and unchanged: not sent
    "UPDATE t SET id = 20 WHERE id = 2",
    "DELETE FROM t WHERE id = 3",
    "BEGIN; INSERT INTO t VALUES (4, 'four'); UPDATE t SET v = 'four!' WHERE id = 4; COMMIT",
    "UPDATE u SET v = 'uno' WHERE id = 1",
    "TRUNCATE t",
    "INSERT INTO t VALUES (5, 'five')",
    "ALTER TABLE t ADD COLUMN w int; INSERT INTO t VALUES (6, 'six', NULL, 66)",
    "ALTER TABLE t DROP COLUMN w; INSERT INTO t VALUES (7, 'seven')",
]

# (op, id, v, old id, unchanged columns) in log order.
EXPECTED = [
    ("truncate", None, None, None, None),
    ("copy", 1, "one", None, None),
    ("copy", 2, "two", None, None),
    ("insert", 3, "three", None, None),
    ("update", 1, "uno", None, ["big"]),
    ("update", 20, "two", 2, None),
    ("delete", 3, None, None, None),
    ("insert", 4, "four", None, None),
    ("update", 4, "four!", None, None),
    ("truncate", None, None, None, None),
    ("insert", 5, "five", None, None),
    ("insert", 6, "six", None, None),  # a column added: the log has it from here on
    ("insert", 7, "seven", None, None),  # and dropped: kept, NULL from here on
]

DOCS = Path(__file__).parents[4] / "docs" / "tables.md"


def current_rows_query(path: str, as_of: int) -> str:
    """docs/tables.md's query of the current rows, on the change log at ``path``."""
    text = DOCS.read_text()
    start = text.index("```sql", text.index("The current rows as of an LSN")) + len("```sql")
    query = text[start : text.index("```", start)]
    return query.replace("{log}", f"delta.`{path}`").replace(":as_of", str(as_of))


RESYNCED = [("truncate", None, None, None, None)] + [
    ("copy", i, v, None, None) for i, v in [(5, "five"), (6, "six"), (7, "seven")]
]


def log_rows(path: str) -> list[dict[str, Any]]:
    """The change log as delta-rs reads it, in log order (LSN, position, then id)."""
    import deltalake

    rows = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r[LSN], r[SEQ], r["id"] or 0))


def commit_infos(path: str) -> list[dict[str, Any]]:
    """The appends' commit infos (the copy's, which made the table, and every batch's), as
    the log holds them."""
    import deltalake

    infos: list[dict[str, Any]] = deltalake.DeltaTable(path).history()
    appends = ("WRITE", "APPEND", "CREATE TABLE AS SELECT")
    return [c for c in infos if c.get("operation") in appends and c.get("userMetadata")]


def shape(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r[OP], r["id"], r["v"], r["_pgsub_old_id"], r["_pgsub_unchanged"]) for r in rows]


@pytest.mark.parametrize("written_by", ["delta-rs", "spark"])
def test_a_change_log_holds_every_change_once_in_commit_order(
    publisher: PgDatabase, spark: Any, warehouse: Path, written_by: str
) -> None:
    """Written by delta-rs on a local warehouse; by Spark where delta-rs may not write the
    table (here: Delta's change data feed on, as a remote warehouse would)."""
    publisher.execute(SCHEMA)
    history = {"tables": {"public.t": "changelog"}}
    features = {"change_data_feed": written_by == "spark"}
    with Replication(
        publisher,
        spark,
        warehouse,
        copy_data=True,
        history=history,
        table_features=features,
        batch={"max_delay": "500ms"},
    ) as rep:
        rep.caught_up()
        for statement in WORKLOAD:
            publisher.execute(statement)
            if "ADD COLUMN" in statement:  # not in one batch with the drop: w would not be seen
                rep.caught_up()
        rep.caught_up()
        path = rep.path("public.t")
        rows = log_rows(path)
        assert shape(rows) == EXPECTED
        copy_lsn = rows[0][LSN]
        assert all(r[LSN] == copy_lsn for r in rows[:3])
        changes = rows[3:]
        assert all(r[LSN] > copy_lsn and r["_pgsub_xid"] for r in changes)
        assert all(r["_pgsub_commit_time"] is not None for r in changes)
        four = [r for r in changes if r["id"] == 4]
        assert four[0][LSN] == four[1][LSN] and four[0][SEQ] < four[1][SEQ]  # one transaction
        assert spark.read.format("delta").load(path).count() == len(EXPECTED)
        engines = {str(c.get("engineInfo")).split(":")[0].split("/")[0] for c in commit_infos(path)}
        # On a local warehouse the copy is pgsub's own commit, the changes delta-rs's.
        assert engines == ({"pgsub", "delta-rs"} if written_by == "delta-rs" else {"Apache-Spark"})
        current = spark.sql(current_rows_query(path, 2**62)).collect()
        with publisher.connect() as conn:
            published = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
        assert sorted((r["id"], r["v"]) for r in current) == published
        assert [r["w"] for r in rows if r["id"] in (5, 6, 7)] == [None, 66, None]
        # As of the LSN before the truncate: the rows then (1 uno, 20 two, 4 four!).
        before = rows[9][LSN] - 1
        then = spark.sql(current_rows_query(path, before)).collect()
        assert sorted((r["id"], r["v"]) for r in then) == [(1, "uno"), (4, "four!"), (20, "two")]
        rep.assert_equal("public.u", key=("id",))  # the other table stays a mirror

        config = Config(warehouse=str(warehouse), subscriptions=[rep.config])
        admin.resync(config, rep.config, ["public.t"])
        wait_until(
            lambda: len(log_rows(path)) == len(EXPECTED) + len(RESYNCED),
            timeout=120,
            what="the resync's rows appended to the change log",
        )
        assert shape(log_rows(path)) == EXPECTED + RESYNCED


def test_a_mirror_is_not_turned_into_a_change_log(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(SCHEMA)
    with Replication(publisher, spark, warehouse, copy_data=True) as rep:
        rep.caught_up()
    with Replication(
        publisher, spark, warehouse, history={"mode": "changelog"}, wal_retrieve_retry_interval=30
    ) as rep:
        publisher.execute("INSERT INTO t VALUES (9, 'nine')")
        wait_until(
            lambda: (
                "is kept as a mirror" in rep.runner.status.last_error
                if rep.runner and rep.runner.status.last_error
                else False
            ),
            timeout=120,
            what="the refusal",
        )
