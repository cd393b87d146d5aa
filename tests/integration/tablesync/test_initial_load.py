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
    """The initial load creates each table and copies into it, two commits in its log's
    folder: the folders naming them are fsynced once, together, after the copy - and before
    the table is recorded created and READY (what a restart trusts)."""
    import apply.delta.files.local_store as local_store
    from apply.delta.tables import DeltaTables

    tables = [f"t{n}" for n in range(6)]
    publisher.execute(
        "".join(f"CREATE TABLE {t} (id int PRIMARY KEY, v text);" for t in tables)
        + "".join(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 50) g;" for t in tables)
        + f"CREATE PUBLICATION pub FOR TABLE {', '.join(tables)};"
    )
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
        recorded = events.index(("remembered", name))
        log_folder = ("synced", os.path.join(path, "_delta_log"))
        before = [event for event in events[:recorded] if event == log_folder]
        # Once before it is recorded: not twice (each commit's), not never (after the record).
        assert len(before) == 1, f"{name}: its log's folder fsynced {len(before)} times first"
