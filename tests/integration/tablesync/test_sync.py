"""Initial copy and handoff against a real publisher: oracle equality, states, slots."""

from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from tablesync.state import TableState
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication
from tests.support.writer import Writer

pytestmark = pytest.mark.integration


def test_initial_sync_under_a_write_workload(
    publisher_any: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """On every publisher major (the matrix's copy and handoff scenario)."""
    publisher = publisher_any
    publisher.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10,2));"
        "CREATE TABLE b (id bigint PRIMARY KEY, doc jsonb, at timestamptz);"
        "CREATE TABLE c (x int, y text);"  # no key: inserts only
        "CREATE TABLE empty (id int PRIMARY KEY);"
        "INSERT INTO a SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, 20000) g;"
        "INSERT INTO b SELECT g, jsonb_build_object('g', g), now() FROM generate_series(1, 5000) g;"
        "INSERT INTO c SELECT g % 7, 'c' FROM generate_series(1, 3000) g;"
        "CREATE PUBLICATION pub FOR TABLE a, b, c, empty"
    )

    def step(conn: psycopg.Connection[Any], n: int) -> None:
        conn.execute("UPDATE a SET v = v || '.' WHERE id = %s", [n % 20000 + 1])
        conn.execute("INSERT INTO b VALUES (%s, '{}', now())", [100000 + n])
        conn.execute("DELETE FROM b WHERE id = %s", [n])
        conn.execute("INSERT INTO c VALUES (%s, 'w')", [n])

    with (
        Writer(publisher, step, pause=0.01) as writer,
        Replication(publisher, spark, warehouse, copy_data=True, max_sync_workers=2) as rep,
    ):
        wait_until(rep.all_ready, timeout=300, what="every table to be READY")
        handed_over = writer.written
        wait_until(lambda: writer.written > handed_over + 50, timeout=60, what="more writes")
        writer.stop()
        rep.caught_up()
        rep.assert_equal("public.a", "public.b", key=("id",))
        rep.assert_equal("public.c", "public.empty")
        # Only the subscription's own slot remains: sync slots are dropped when done.
        assert publisher.slots() == ["sub1"]
        metrics = rep.metrics.registry
        copied = metrics.get_sample_value(
            "pgsub_tablesync_rows_copied_total",
            {"subscription": "sub1", "relation": "public.a"},
        )
        assert copied is not None and copied >= 20000
        ready = metrics.get_sample_value(
            "pgsub_table_state",
            {"subscription": "sub1", "relation": "public.b", "state": "ready"},
        )
        assert ready == 1
        assert rep.runner is not None
        listed = cast("list[dict[str, Any]]", rep.runner.status.as_dict()["tables"])
        tables = {t["table"]: t for t in listed}  # /status
        assert tables["public.a"]["state"] == "ready"
        assert tables["public.a"]["rows_copied"] == 20000


def test_refresh_adds_new_tables_and_removes_dropped_ones(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    from subscriber.runtime.admin import refresh_publication
    from subscriber.runtime.config import Config

    publisher.execute(
        "CREATE TABLE old (id int PRIMARY KEY); INSERT INTO old VALUES (1);"
        "CREATE TABLE later (id int PRIMARY KEY, v text);"
        "INSERT INTO later SELECT g, 'before' FROM generate_series(1, 100) g;"
        "CREATE PUBLICATION pub FOR TABLE old"
    )
    with Replication(publisher, spark, warehouse, copy_data=True) as rep:
        wait_until(rep.all_ready, timeout=300, what="old READY")
        config = Config(warehouse=str(warehouse), subscriptions=[rep.config])
        publisher.execute("ALTER PUBLICATION pub ADD TABLE later")
        publisher.execute("INSERT INTO later VALUES (101, 'after the add')")
        assert refresh_publication(config, rep.config) == (["public.later"], [])

        def later_ready() -> bool:
            assert rep.runner is not None
            states = {s.qualified_name: s.state for s in rep.runner.coordinator.statuses}
            return states.get("public.later") is TableState.READY

        wait_until(later_ready, timeout=300, what="the new table READY")
        publisher.execute("UPDATE later SET v = 'streamed' WHERE id <= 10")
        rep.caught_up()
        rep.assert_equal("public.later", key=("id",))

        publisher.execute("DROP TABLE old")
        assert refresh_publication(config, rep.config) == ([], ["public.old"])

        def old_gone() -> bool:
            assert rep.runner is not None
            return {s.qualified_name for s in rep.runner.coordinator.statuses} == {"public.later"}

        wait_until(old_gone, timeout=60, what="the dropped table to leave the subscription")
        assert rep.rows("public.old") == [{"id": 1}]  # its Delta table is kept
        assert refresh_publication(config, rep.config) == ([], [])


def test_a_resync_after_a_column_was_dropped_keeps_the_column_null(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """The Delta table keeps a column the publisher dropped; a copy written by delta-rs
    (a local warehouse) fills it with NULL instead of failing on the schema."""
    from subscriber.runtime import admin
    from subscriber.runtime.config import Config

    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text, gone int);"
        "INSERT INTO t VALUES (1, 'a', 10), (2, 'b', 20);"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    with Replication(publisher, spark, warehouse, copy_data=True) as rep:
        rep.caught_up()
        publisher.execute("ALTER TABLE t DROP COLUMN gone; INSERT INTO t VALUES (3, 'c')")
        rep.caught_up()
        config = Config(warehouse=str(warehouse), subscriptions=[rep.config])
        admin.resync(config, rep.config, ["public.t"])
        path = rep.path("public.t")

        def copied_again() -> bool:
            import deltalake

            rows = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
            return sorted((r["id"], r["v"], r["gone"]) for r in rows) == [
                (1, "a", None),
                (2, "b", None),
                (3, "c", None),
            ]

        wait_until(copied_again, timeout=120, what="the resync's copy, gone NULL")
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
