"""The first start's copy under the subscription slot's own snapshot (tablesync.initial_load),
beside PostgreSQL's protocol for what it leaves: a larger table, and everything with it off."""

import os
from pathlib import Path
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication
from tests.support.writer import Writer

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE small (id int PRIMARY KEY, v text);
CREATE TABLE bag (x int, y text);
CREATE TABLE empty (id int PRIMARY KEY);
CREATE TABLE big (id int PRIMARY KEY, pad text);
INSERT INTO small SELECT g, 's' || g FROM generate_series(1, 2000) g;
INSERT INTO bag SELECT g % 5, 'b' FROM generate_series(1, 500) g;
INSERT INTO big SELECT g, repeat('p', 200) FROM generate_series(1, 8000) g;
CREATE PUBLICATION pub FOR TABLE small, bag, empty, big;
"""
SMALL = {"public.small", "public.bag", "public.empty"}


def published_tables(publisher: PgDatabase, count: int, *, rows: int) -> list[str]:
    """Tables t0, t1, ... of ``rows`` rows each, in publication ``pub``; their names."""
    tables = [f"t{n}" for n in range(count)]
    publisher.execute(
        "".join(f"CREATE TABLE {t} (id int PRIMARY KEY, v text);" for t in tables)
        + "".join(
            f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, {rows}) g;" for t in tables
        )
        + f"CREATE PUBLICATION pub FOR TABLE {', '.join(tables)};"
    )
    return tables


def step(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute("UPDATE small SET v = v || '+' WHERE id = %s", [n % 2000 + 1])
    conn.execute("INSERT INTO bag VALUES (%s, 'w')", [n])
    conn.execute("INSERT INTO empty VALUES (%s)", [n])
    conn.execute("UPDATE big SET pad = 'q' WHERE id = %s", [n % 8000 + 1])


@pytest.mark.parametrize("initial_load", [True, False], ids=["initial_load", "per_table"])
def test_first_start_copies_small_tables_under_the_slot_snapshot(
    publisher: PgDatabase, spark: Any, warehouse: Path, initial_load: bool
) -> None:
    """Under a writer: the three small tables are copied under the subscription slot's
    snapshot, READY at its consistent point with no sync slot; ``big`` (above range_size)
    is synchronized on its own, as PostgreSQL does. Off, every table is. Every table ends
    equal to the publisher, with only the subscription's slot left."""
    publisher.execute(SCHEMA)
    with (
        capture_logs() as logs,
        Writer(publisher, step, pause=0.01) as writer,
        Replication(
            publisher,
            spark,
            warehouse,
            copy_data=True,
            max_sync_workers=2,
            copy={"range_size": "1MiB", "initial_load": initial_load},
        ) as rep,
    ):
        wait_until(rep.all_ready, timeout=300, what="every table to be READY")
        ready_at = writer.written
        wait_until(lambda: writer.written > ready_at + 20, timeout=60, what="more writes")
        writer.stop()
        rep.caught_up()
        rep.assert_equal("public.small", "public.big", key=("id",))
        rep.assert_equal("public.bag", "public.empty")
        assert publisher.slots() == ["sub1"]
    created = [e for e in logs if e["event"] == "replication slot created"]
    own = [e for e in created if e["slot"] == "sub1"]
    synced_alone = {e["table"] for e in logs if e["event"] == "table synchronized"}
    loads = [e for e in logs if e["event"] == "initial load finished"]
    if not initial_load:
        assert loads == []
        assert synced_alone == SMALL | {"public.big"}
        return
    assert len(loads) == 1 and loads[0]["ready"] == 3 and loads[0]["left_to_sync_workers"] == 1
    assert synced_alone == {"public.big"}  # its own slot, copy, catch-up and handover
    assert len(created) == 2 and len(own) == 1  # the subscription's slot and big's sync slot
    consistent_point = own[0]["consistent_point"]
    loaded = [
        e
        for e in logs
        if e["event"] == "table state changed" and e["state"] == "ready" and e["table"] in SMALL
    ]
    assert {e["table"] for e in loaded} == SMALL
    assert {e["lsn"] for e in loaded} == {consistent_point}
    copies = {e["table"]: e for e in logs if e["event"] == "table copy finished"}
    assert {copies[t]["lsn"] for t in SMALL} == {consistent_point}


def test_each_loaded_tables_names_are_made_durable_once_and_before_it_is_ready(
    publisher: PgDatabase, spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The initial load creates each table with its copy's rows: one commit, its version 0
    (a creation then a copy made two, and the copy opened the table with delta-rs), read by
    delta-rs as the publisher has it. The folders naming it are fsynced once, after the
    copy - and before the table is recorded created and READY (what a restart trusts)."""
    import deltalake

    import apply.delta.files.local_store as local_store
    from apply.delta.tables import DeltaTables

    tables = published_tables(publisher, 6, rows=50)
    events: list[tuple[str, str]] = []
    sync_folder, remember = local_store._sync_folder, DeltaTables.remember_created

    def synced(path: str) -> None:
        sync_folder(path)
        events.append(("synced", os.path.normpath(path)))

    def remembered(self: DeltaTables, names: list[str]) -> None:
        events.extend(("remembered", name) for name in names)
        remember(self, names)

    monkeypatch.setattr(local_store, "_sync_folder", synced)
    monkeypatch.setattr(DeltaTables, "remember_created", remembered)
    with Replication(publisher, spark, warehouse, copy_data=True, max_sync_workers=2) as rep:
        wait_until(rep.all_ready, timeout=300, what="every table to be READY")
        paths = {f"public.{t}": os.path.normpath(rep.path(f"public.{t}")) for t in tables}
        for name in paths:
            rep.assert_equal(name, key=("id",))
    for name, path in paths.items():
        table = deltalake.DeltaTable(path)  # not Spark
        assert table.version() == 0, f"{name}: {table.version() + 1} commits"
        assert [c["operation"] for c in table.history()] == ["CREATE TABLE AS SELECT"]
        assert table.to_pyarrow_table().num_rows == 50
        assert table.protocol().min_reader_version == 1  # no table feature its data needs
        recorded = events.index(("remembered", name))
        log_folder = ("synced", os.path.join(path, "_delta_log"))
        before = [event for event in events[:recorded] if event == log_folder]
        # Once before it is recorded: not twice (each commit's), not never (after the record).
        assert len(before) == 1, f"{name}: its log's folder fsynced {len(before)} times first"


def test_status_shows_the_loaded_tables_ready_when_the_load_ends(
    publisher: PgDatabase, spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/status`` shows each loaded table READY once the load has stored it - the last
    ones too, not only at the leader's first status sample half a second later. Each copy
    and each status look slowed, the last copy ends while the status is looked at."""
    import time

    from subscriber.runtime.subscription import SubscriptionRunner
    from tablesync.initial_load import InitialLoad

    tables = published_tables(publisher, 4, rows=20)
    shown: list[dict[str, str]] = []
    run = InitialLoad.run

    def run_and_look(self: InitialLoad, *args: Any, **kwargs: Any) -> list[int]:
        ready = run(self, *args, **kwargs)
        status = kwargs["beat"].__self__.status  # the runner's ``_loading``
        shown.append({str(t["table"]): str(t["state"]) for t in status.tables})
        return ready

    copy, look = InitialLoad._copy, SubscriptionRunner._loading

    def slow_copy(self: InitialLoad, *args: Any) -> None:
        copy(self, *args)
        time.sleep(0.2)  # four tables: the copies end within the first look (0.5-1.5 s)

    def slow_look(self: SubscriptionRunner) -> None:
        look(self)
        time.sleep(1.0)

    monkeypatch.setattr(InitialLoad, "run", run_and_look)
    monkeypatch.setattr(InitialLoad, "_copy", slow_copy)
    monkeypatch.setattr(SubscriptionRunner, "_loading", slow_look)
    with Replication(publisher, spark, warehouse, copy_data=True, max_sync_workers=1) as rep:
        wait_until(rep.all_ready, timeout=300, what="every table to be READY")
    assert shown == [{f"public.{t}": "ready" for t in tables}]
