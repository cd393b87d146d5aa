"""Each action per kind, and *_origin_differs, from real scenarios against real Delta tables.

Another writer changes the Delta table (Spark SQL, as a repair job or a
second pipeline would), then the publisher's change arrives.
"""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.integration.conflicts.test_conflicts import conflict_rows, counter
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t"


def other_writer(spark: Any, rep: Replication, statement: str) -> None:
    """Run ``statement`` (with ``{t}`` for the table) as another writer of the Delta table."""
    spark.sql(statement.format(t=f"delta.`{rep.path('public.t')}`"))


def values(rep: Replication) -> list[tuple[int, str]]:
    return sorted((r["id"], r["v"]) for r in rep.rows("public.t"))


def test_origin_differs_is_reported_and_applied_by_default(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(TABLE)
    with (
        Replication(publisher, spark, warehouse, track_origin=True) as rep,
        capture_logs() as events,
    ):
        publisher.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 4) g")
        rep.caught_up()
        other_writer(spark, rep, "UPDATE {t} SET v = 'local' WHERE id IN (1, 2)")
        publisher.execute("UPDATE t SET v = 'remote' WHERE id = 1; DELETE FROM t WHERE id = 2")
        publisher.execute("UPDATE t SET v = 'plain' WHERE id = 3")
        rep.caught_up()
        assert counter(rep, "update_origin_differs") == 1
        assert counter(rep, "delete_origin_differs") == 1
        rep.assert_equal("public.t", key=("id",))
        # The rows are ours again: the next changes are not conflicts.
        publisher.execute("UPDATE t SET v = 'again' WHERE id = 1")
        rep.caught_up()
        assert counter(rep, "update_origin_differs") == 1
        rep.assert_equal("public.t", key=("id",))
    messages = [e for e in events if str(e["event"]).startswith("conflict detected")]
    assert sorted(e["conflict"] for e in messages) == [
        "delete_origin_differs",
        "update_origin_differs",
    ]
    update = next(e for e in messages if e["conflict"] == "update_origin_differs")
    assert update["event"] == (
        'conflict detected on relation "public.t": conflict=update_origin_differs'
    )
    assert re.match(
        r"Updating the row that was modified by another writer in Delta version \d+\."
        r" Existing local row \(1, local\); remote row \(1, remote\);"
        r" replica identity \(id\)=\(1\)",
        update["detail"],
    ), update["detail"]
    assert update["log_level"] == "warning" and update["resolution"] == "apply_remote"
    rows = conflict_rows(spark, warehouse)
    assert sorted(r["type"] for r in rows) == ["delete_origin_differs", "update_origin_differs"]
    assert all(r["local_version"] is not None for r in rows)
    assert json.loads(rows[0]["existing_local_row"])["v"] == "local"


def test_origin_differs_keep_local_and_skip_keep_the_other_writers_rows(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(TABLE)
    actions = {"update_origin_differs": "keep_local", "delete_origin_differs": "skip"}
    with Replication(publisher, spark, warehouse, conflicts=actions, track_origin=True) as rep:
        publisher.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 4) g")
        rep.caught_up()
        other_writer(spark, rep, "UPDATE {t} SET v = 'local' WHERE id IN (1, 2)")
        other_writer(spark, rep, "INSERT INTO {t} VALUES (7, 'local7')")
        publisher.execute(
            "UPDATE t SET v = 'remote' WHERE id IN (1, 3); DELETE FROM t WHERE id = 2;"
            " UPDATE t SET id = 10 WHERE id = 4"
        )
        rep.caught_up()
        assert counter(rep, "update_origin_differs") == 1
        assert counter(rep, "delete_origin_differs") == 1
        assert values(rep) == [(1, "local"), (2, "local"), (3, "remote"), (7, "local7"), (10, "v4")]
        resolutions = sorted((r["type"], r["resolution"]) for r in conflict_rows(spark, warehouse))
        assert resolutions == [
            ("delete_origin_differs", "skip"),
            ("update_origin_differs", "keep_local"),
        ]


def test_origin_differs_error_stops_until_the_transaction_is_skipped(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(TABLE)
    actions = {"update_origin_differs": "error"}
    with Replication(publisher, spark, warehouse, conflicts=actions, track_origin=True) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
        rep.caught_up()
        other_writer(spark, rep, "UPDATE {t} SET v = 'local' WHERE id = 1")
        publisher.execute("UPDATE t SET v = 'remote' WHERE id = 1")
        publisher.execute("UPDATE t SET v = 'after' WHERE id = 2")
        lsn = rep.failed_at()
        runner = rep.runner
        assert runner is not None
        assert "conflict=update_origin_differs" in (runner.status.last_error or "")
        assert values(rep) == [(1, "local"), (2, "two")]  # nothing of the batch applied
        rep.skip(lsn)
        rep.caught_up()
        assert values(rep) == [(1, "local"), (2, "after")]


@pytest.mark.parametrize("binary", [False, True])
def test_exists_skip_and_keep_local_keep_the_local_row(
    publisher: PgDatabase, spark: Any, warehouse: Path, binary: bool
) -> None:
    """Also with ``binary: true``: the keys of the batch, resolved, stay binary values."""
    publisher.execute(TABLE)
    actions = {"insert_exists": "keep_local", "update_exists": "skip"}
    with Replication(publisher, spark, warehouse, conflicts=actions, binary=binary) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'one')")
        rep.caught_up()
        other_writer(spark, rep, "INSERT INTO {t} VALUES (5, 'local5'), (6, 'local6'), (9, 'l9')")
        publisher.execute("INSERT INTO t VALUES (5, 'remote5')")
        # Insert then update of a taken key: the insert is skipped, the update applies.
        publisher.execute(
            "BEGIN; INSERT INTO t VALUES (6, 'remote6'); UPDATE t SET v = 'upd6' WHERE id = 6;"
            " COMMIT"
        )
        # A move onto a taken key is skipped: the row stays at its old key.
        publisher.execute("UPDATE t SET id = 9 WHERE id = 1")
        rep.caught_up()
        assert counter(rep, "insert_exists") == 2 and counter(rep, "update_exists") == 1
        assert values(rep) == [(1, "one"), (5, "local5"), (6, "upd6"), (9, "l9")]
        # A batch whose every change is skipped writes nothing, and goes on.
        other_writer(spark, rep, "INSERT INTO {t} VALUES (7, 'local7')")
        publisher.execute("INSERT INTO t VALUES (7, 'remote7')")
        rep.caught_up()
        assert counter(rep, "insert_exists") == 3
        assert values(rep)[-2:] == [(7, "local7"), (9, "l9")]


def test_missing_row_actions_apply_remote_and_error(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(TABLE)
    actions = {"update_missing": "apply_remote", "delete_missing": "error"}
    with Replication(publisher, spark, warehouse, conflicts=actions) as rep:
        publisher.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3) g")
        rep.caught_up()
        other_writer(spark, rep, "DELETE FROM {t} WHERE id IN (1, 2)")
        publisher.execute("UPDATE t SET v = 'back' WHERE id = 1")  # re-inserted
        rep.caught_up()
        assert counter(rep, "update_missing") == 1
        assert values(rep) == [(1, "back"), (3, "v3")]
        publisher.execute("DELETE FROM t WHERE id = 2")  # stops
        publisher.execute("UPDATE t SET v = 'after' WHERE id = 3")
        lsn = rep.failed_at()
        runner = rep.runner
        assert runner is not None
        assert "conflict=delete_missing" in (runner.status.last_error or "")
        assert values(rep) == [(1, "back"), (3, "v3")]
        rep.skip(lsn)
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))


def test_by_default_tables_have_no_row_tracking_and_origin_is_not_judged(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    from delta.tables import DeltaTable

    publisher.execute(TABLE)
    with Replication(publisher, spark, warehouse) as rep:
        publisher.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
        rep.caught_up()
        detail = DeltaTable.forPath(spark, rep.path("public.t")).detail().first()
        assert detail is not None
        assert "delta.enableRowTracking" not in (detail["properties"] or {})
        other_writer(spark, rep, "UPDATE {t} SET v = 'local' WHERE id = 1")
        publisher.execute("UPDATE t SET v = 'remote' WHERE id = 1")
        rep.caught_up()
        assert counter(rep, "update_origin_differs") == 0
        rep.assert_equal("public.t", key=("id",))
