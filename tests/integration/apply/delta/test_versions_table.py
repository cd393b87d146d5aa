"""``history: scd2``: a table kept as versions, one row per version of each key with the LSN
and time it was valid from and to, through the copy, inserts, updates (unchanged TOAST, a
key change, two in one transaction), deletes, a TRUNCATE, update_missing, and a resync;
another table of the same subscription stays a plain mirror. Read back by delta-rs (not
Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apply.history.versions import CURRENT, VALID_FROM, VALID_FROM_TIME, VALID_TO, VALID_TO_TIME
from subscriber.runtime import admin
from subscriber.runtime.config import Config
from tests.integration.apply.delta.test_stamped_tables import (
    BIG,
    SCHEMA,
    current_lsn,
    merged_by,
)
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def versions(path: str) -> list[dict[str, Any]]:
    """Every version, as delta-rs reads the table, by key then valid-from LSN."""
    import deltalake

    rows = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r["id"], r[VALID_FROM]))


def history(path: str) -> list[tuple[int, str | None, bool]]:
    return [(r["id"], r["v"], r[CURRENT]) for r in versions(path)]


def current(path: str) -> dict[int, str | None]:
    return {r["id"]: r["v"] for r in versions(path) if r[CURRENT]}


def published(publisher: PgDatabase) -> dict[int, str | None]:
    with publisher.connect() as conn:
        return dict(conn.execute("SELECT id, v FROM t").fetchall())


@pytest.mark.parametrize("written_by", ["delta-rs", "spark"])
def test_a_versions_table_keeps_every_committed_version_of_each_key(
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
        history={"tables": {"public.t": "scd2"}},
        table_features=features,
        batch={"max_delay": "300ms"},
    ) as rep:
        rep.caught_up()
        path = rep.path("public.t")
        copied = versions(path)
        assert history(path) == [(1, "one", True), (2, "two", True), (10, "ten", True)]
        copy_lsn = copied[0][VALID_FROM]
        assert all(r[VALID_FROM] == copy_lsn and r[VALID_FROM_TIME] is None for r in copied)
        assert all(r[VALID_TO] is None and r[VALID_TO_TIME] is None for r in copied)

        publisher.execute("INSERT INTO t VALUES (3, 'three')")
        rep.caught_up()
        before_updates = current_lsn(publisher)
        publisher.execute("UPDATE t SET v = 'uno' WHERE id = 1")  # big: unchanged TOAST
        publisher.execute("UPDATE t SET id = 20 WHERE id = 2")  # 2 closed, 20 opened
        publisher.execute(  # one transaction, one version
            "BEGIN; UPDATE t SET v = 'x' WHERE id = 10; UPDATE t SET v = 'diez' WHERE id = 10;"
            " COMMIT"
        )
        publisher.execute("DELETE FROM t WHERE id = 3")
        rep.caught_up()
        assert history(path) == [
            (1, "one", False),
            (1, "uno", True),
            (2, "two", False),
            (3, "three", False),
            (10, "ten", False),
            (10, "diez", True),
            (20, "two", True),
        ]
        got = versions(path)
        by = {(r["id"], r["v"]): r for r in got}
        assert by[(1, "uno")]["big"] == BIG  # from the version it replaced
        assert by[(1, "one")][VALID_TO] == by[(1, "uno")][VALID_FROM] > before_updates
        assert by[(2, "two")][VALID_TO] == by[(20, "two")][VALID_FROM]  # one commit
        assert by[(3, "three")][VALID_TO] > by[(3, "three")][VALID_FROM] > copy_lsn
        assert all(r[VALID_TO_TIME] is not None for r in got if not r[CURRENT])
        assert all(r[VALID_TO] is None for r in got if r[CURRENT])
        assert current(path) == published(publisher)
        assert merged_by(path) == {"delta-rs" if written_by == "delta-rs" else "Apache-Spark"}
        rep.assert_equal("public.u", key=("id",))  # the other table stays a plain mirror

        before_truncate = current_lsn(publisher)
        publisher.execute("BEGIN; TRUNCATE t; INSERT INTO t VALUES (5, 'five'); COMMIT")
        rep.caught_up()
        after = versions(path)
        truncated_at = next(r[VALID_FROM] for r in after if r["id"] == 5)
        assert truncated_at > before_truncate
        closed = {(r["id"], r["v"]): r[VALID_TO] for r in after if r[VALID_FROM] < truncated_at}
        assert closed[(1, "uno")] == closed[(10, "diez")] == closed[(20, "two")] == truncated_at
        assert closed[(1, "one")] < truncated_at  # closed before keeps its end
        assert current(path) == published(publisher) == {5: "five"}

        # A key the table has no current version of: the publisher's update is skipped.
        spark.sql(f"UPDATE delta.`{path}` SET {CURRENT} = false WHERE id = 5")
        publisher.execute("UPDATE t SET v = 'cinq' WHERE id = 5")
        publisher.execute("INSERT INTO t VALUES (6, 'six')")
        labels = {"subscription": "sub1", "relation": "public.t", "type": "update_missing"}
        wait_until(
            lambda: rep.metrics.registry.get_sample_value("pgsub_conflicts_total", labels) == 1,
            timeout=120,
            what="update_missing reported",
        )
        rep.caught_up()
        assert current(path) == {6: "six"}

        # A resync closes every current version at the copy and opens the copy's rows there.
        before = versions(path)
        config = Config(warehouse=str(warehouse), subscriptions=[rep.config])
        admin.resync(config, rep.config, ["public.t"])
        wait_until(lambda: current(path) == {5: "cinq", 6: "six"}, timeout=120, what="the resync")
        again = versions(path)
        copy_lsn = next(r[VALID_FROM] for r in again if r["id"] == 5 and r[CURRENT])
        assert {r["id"] for r in again if r[VALID_FROM] == copy_lsn} == {5, 6}
        six = [r for r in again if r["id"] == 6]
        assert [r[CURRENT] for r in six] == [False, True] and six[0][VALID_TO] == copy_lsn
        assert len(again) == len(before) + 2


def test_a_transaction_applied_in_pieces_leaves_one_version_per_key(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """A transaction larger than a batch is applied piece by piece: a version one piece
    opened and a later piece of the same transaction replaced is removed, not closed."""
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(
        publisher,
        spark,
        warehouse,
        copy_data=True,
        history={"mode": "scd2"},
        batch={"max_changes": 10, "max_delay": "300ms"},
    ) as rep:
        rep.caught_up()
        publisher.execute(
            "BEGIN; INSERT INTO t SELECT g, 'new' FROM generate_series(1, 30) g;"
            " UPDATE t SET v = 'changed'; UPDATE t SET v = 'last' WHERE id <= 5; COMMIT"
        )
        rep.caught_up()
        path = rep.path("public.t")
        kept = versions(path)
        assert len(kept) == 30 and all(r[CURRENT] and r[VALID_TO] is None for r in kept)
        assert current(path) == published(publisher)
        assert len({r[VALID_FROM] for r in kept}) == 1  # the transaction's commit
        import deltalake

        merges = [c for c in deltalake.DeltaTable(path).history() if c["operation"] == "MERGE"]
        assert len(merges) >= 3  # 65 changes, 10 a piece


def test_a_versions_table_an_earlier_pgsub_marked_as_a_mirror_is_corrected(
    spark: Any, warehouse: Path
) -> None:
    """pgsub before 2026-11-28 judged a versions table's kept mode by the versions' own
    columns (no key) and recorded ``pgsub.history = mirror``, logging that a scd2 table
    needs a key; such a table is recognised by its columns and its property set right."""
    from structlog.testing import capture_logs

    from apply.columns.schema import target_schema
    from apply.delta.table_options import TableOptions
    from apply.delta.tables import DeltaTables
    from apply.history.changelog import History, HistoryMode
    from tests.unit.apply.builders import relation

    options = TableOptions(history=History(HistoryMode.SCD2))
    schema = target_schema(relation("id", "v"), lambda oid: None, True)
    with capture_logs() as logs:
        DeltaTables(spark, str(warehouse), "sub1", options).prepare(schema)
    assert not [e for e in logs if "needs a key" in e["event"]]
    path = f"delta.`{warehouse}/public/t`"
    spark.sql(f"ALTER TABLE {path} SET TBLPROPERTIES ('pgsub.history' = 'mirror')")
    DeltaTables(spark, str(warehouse), "sub1", options).prepare(schema)  # no error
    properties = spark.sql(f"SHOW TBLPROPERTIES {path}").collect()
    assert {r["key"]: r["value"] for r in properties}["pgsub.history"] == "scd2"
