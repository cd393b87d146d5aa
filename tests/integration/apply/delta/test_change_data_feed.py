"""``table_features.change_data_feed: true``: every commit of a target table also records its
row-level changes, read back by Spark's change feed and by delta-rs's ``load_cdf``, whether
the table was created with the feed or had it turned on later. Readers that do not know the
feed still read the table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

# (change type, id, v) as a reader of the feed sees them after the copy.
EXPECTED = Counter(
    [
        ("insert", 4, "four"),
        ("update_preimage", 1, "one"),
        ("update_postimage", 1, "uno"),
        ("delete", 2, "two"),
        # TRUNCATE: every row left is deleted.
        ("delete", 1, "uno"),
        ("delete", 3, "three"),
        ("delete", 4, "four"),
        ("insert", 5, "five"),
    ]
)


def properties(spark: Any, path: str) -> dict[str, str]:
    return dict(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["properties"] or {})


def spark_changes(spark: Any, path: str, since: int) -> Counter[tuple[str, int, str]]:
    frame = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", since)
        .load(path)
    )
    return Counter((r["_change_type"], r["id"], r["v"]) for r in frame.collect())


def delta_rs_changes(path: str, since: int) -> Counter[tuple[str, int, str]]:
    import deltalake

    changes = deltalake.DeltaTable(path).load_cdf(starting_version=since).read_all()
    return Counter(
        zip(
            changes["_change_type"].to_pylist(),
            changes["id"].to_pylist(),
            changes["v"].to_pylist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("turned_on", ["at_creation", "later"])
def test_the_change_feed_records_every_change_for_spark_and_delta_rs(
    publisher: PgDatabase, spark: Any, warehouse: Path, turned_on: str
) -> None:
    import deltalake

    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t VALUES (1, 'one'), (2, 'two'), (3, 'three');"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    feed = {"change_data_feed": True}
    first = {} if turned_on == "later" else feed
    with Replication(publisher, spark, warehouse, copy_data=True, table_features=first) as rep:
        rep.caught_up()
        path = rep.path("public.t")
    wants_feed = turned_on == "at_creation"
    assert (properties(spark, path).get("delta.enableChangeDataFeed") == "true") == wants_feed
    with Replication(
        publisher,
        spark,
        warehouse,
        copy_data=True,
        table_features=feed,
        batch={"max_changes": 1, "max_delay": "10ms"},
    ) as rep:
        rep.caught_up()
        since = deltalake.DeltaTable(path).version() + 1
        with publisher.connect() as conn:
            conn.execute("INSERT INTO t VALUES (4, 'four')")
            conn.execute("UPDATE t SET v = 'uno' WHERE id = 1")
            conn.execute("DELETE FROM t WHERE id = 2")
            conn.execute("TRUNCATE t")
            conn.execute("INSERT INTO t VALUES (5, 'five')")
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))  # Spark, and delta-rs
    # Turned on later: before the table's first write after the restart.
    assert properties(spark, path).get("delta.enableChangeDataFeed") == "true"
    assert spark_changes(spark, path, since) == EXPECTED
    assert delta_rs_changes(path, since) == EXPECTED
