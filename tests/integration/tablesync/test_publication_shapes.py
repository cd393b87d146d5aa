"""Row filters, column lists and partitions: the reference pages' examples, copy and stream."""

from pathlib import Path
from typing import Any

import pytest

from tablesync.state import TableState
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def synced(publisher: PgDatabase, spark: Any, warehouse: Path, *pubs: str) -> Replication:
    rep = Replication(publisher, spark, warehouse, publications=pubs, copy_data=True).start()

    def ready() -> bool:
        assert rep.runner is not None
        statuses = rep.runner.coordinator.statuses
        return bool(statuses) and all(s.state is TableState.READY for s in statuses)

    wait_until(ready, timeout=300, what="every table to be READY")
    return rep


def rows(rep: Replication, table: str, *columns: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in columns) for r in rep.rows(table))


def test_row_filter_example_update_becomes_insert_and_delete(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));"
        "CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');"
        # Half the documentation's rows exist before the subscription (the copy),
        "INSERT INTO t1 VALUES (2, 102, 'NSW'), (3, 103, 'QLD'),"
        " (4, 104, 'VIC'), (5, 105, 'ACT')"
    )
    rep = synced(publisher, spark, warehouse, "p1")
    try:
        # ...half arrive through the stream.
        publisher.execute(
            "INSERT INTO t1 VALUES (6, 106, 'NSW'), (7, 107, 'NT'),"
            " (8, 108, 'QLD'), (9, 109, 'NSW')"
        )
        rep.caught_up()
        assert rows(rep, "public.t1", "a", "b", "c") == [(6, 106, "NSW"), (9, 109, "NSW")]
        publisher.execute("UPDATE t1 SET b = 999 WHERE a = 6")  # both match: an UPDATE
        publisher.execute("UPDATE t1 SET a = 555 WHERE a = 2")  # only the new row: an INSERT
        publisher.execute("UPDATE t1 SET c = 'VIC' WHERE a = 9")  # only the old row: a DELETE
        rep.caught_up()
        assert rows(rep, "public.t1", "a", "b", "c") == [(6, 999, "NSW"), (555, 102, "NSW")]
    finally:
        rep.stop()


def test_filters_of_several_publications_are_ored(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));"
        "CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));"
        "CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));"
        "CREATE PUBLICATION p1 FOR TABLE t1 WHERE (a > 5 AND c = 'NSW');"
        "CREATE PUBLICATION p2 FOR TABLE t1, t2 WHERE (e = 99);"
        "CREATE PUBLICATION p3 FOR TABLE t2 WHERE (d = 10), t3 WHERE (g = 10);"
        "INSERT INTO t1 VALUES (1, 1, 'QLD'), (7, 7, 'NSW');"
        "INSERT INTO t2 VALUES (1, 99, 1), (2, 1, 2), (10, 5, 10);"
        "INSERT INTO t3 VALUES (1, 1, 1), (10, 10, 10)"
    )
    rep = synced(publisher, spark, warehouse, "p1", "p2", "p3")
    try:
        publisher.execute(
            "INSERT INTO t2 VALUES (3, 99, 3), (4, 4, 4); INSERT INTO t3 VALUES (11, 1, 1)"
        )
        rep.caught_up()
        # t1: p2 publishes it without a filter, so every row.
        assert rows(rep, "public.t1", "a", "c") == [(1, "QLD"), (7, "NSW")]
        assert rows(rep, "public.t2", "d") == [(1,), (3,), (10,)]  # e = 99 OR d = 10
        assert rows(rep, "public.t3", "g") == [(10,)]
    finally:
        rep.stop()


def test_column_list(publisher: PgDatabase, spark: Any, warehouse: Path) -> None:
    publisher.execute(
        "CREATE TABLE t(id int PRIMARY KEY, secret text, visible text, n int);"
        "CREATE PUBLICATION p FOR TABLE t (id, visible, n);"
        "INSERT INTO t VALUES (1, 's1', 'v1', 1), (2, 's2', 'v2', 2)"
    )
    rep = synced(publisher, spark, warehouse, "p")
    try:
        publisher.execute(
            "INSERT INTO t VALUES (3, 's3', 'v3', 3); UPDATE t SET n = 20 WHERE id = 2"
        )
        rep.caught_up()
        columns = spark.read.format("delta").load(rep.path("public.t")).columns
        assert columns == ["id", "visible", "n"]
        assert rows(rep, "public.t", "id", "visible", "n") == [
            (1, "v1", 1),
            (2, "v2", 20),
            (3, "v3", 3),
        ]
    finally:
        rep.stop()


@pytest.mark.parametrize("via_root", [True, False])
def test_partitioned_table_example(
    via_root: bool, publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a);"
        "CREATE TABLE child PARTITION OF parent DEFAULT;"
        + (
            "CREATE PUBLICATION p4 FOR TABLE parent WHERE (a < 5), child WHERE (a >= 5)"
            " WITH (publish_via_partition_root=true);"
            if via_root
            else "CREATE PUBLICATION p4 FOR TABLE parent, child WHERE (a >= 5)"
            " WITH (publish_via_partition_root=false);"
        )
        + "INSERT INTO parent VALUES (2), (6); INSERT INTO child VALUES (3), (7)"
    )
    rep = synced(publisher, spark, warehouse, "p4")
    try:
        publisher.execute("INSERT INTO parent VALUES (4); INSERT INTO child VALUES (5)")
        rep.caught_up()
        if via_root:
            # Published as the root, with the root's filter.
            assert rows(rep, "public.parent", "a") == [(2,), (3,), (4,)]
        else:
            # Published as the partition, with the partition's filter.
            assert rows(rep, "public.child", "a") == [(5,), (6,), (7,)]
    finally:
        rep.stop()


def test_different_column_lists_are_an_error_naming_them(publisher: PgDatabase) -> None:
    from tablesync.publication import PublicationError, published_tables

    publisher.execute(
        "CREATE TABLE t(id int PRIMARY KEY, a text, b text);"
        "CREATE PUBLICATION pa FOR TABLE t (id, a); CREATE PUBLICATION pb FOR TABLE t (id, b);"
        "CREATE PUBLICATION pc FOR TABLE t (id, a)"
    )
    with publisher.connect() as conn:
        with pytest.raises(
            PublicationError, match=r'"public.t" in different publications \(pa, pb\)'
        ):
            published_tables(conn, ["pa", "pb"])
        (table,) = published_tables(conn, ["pa", "pc"])  # the same list twice is fine
        assert table.columns == ("id", "a")
        with pytest.raises(PublicationError, match="publication nope does not exist"):
            published_tables(conn, ["pa", "nope"])
