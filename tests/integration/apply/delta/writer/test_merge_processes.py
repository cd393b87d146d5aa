"""Keyed batches merged in writer processes (``writer_processes``,
apply/delta/writer/merge_processes.py): the same tables, marks and exactly-once as the
apply process's threads; a process that dies fails only its writes, which are written
again; another engine's commit is read by the process that holds the table; no process
outlives ``close``."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest
from structlog.testing import capture_logs

from apply.columns.schema import target_schema
from apply.delta import tables_state
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from apply.delta.writer.merge_processes import AUTO_TABLES, MergeProcesses
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation
from tests.support.delta_log import writers
from tests.support.pgcluster import wait_until
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

pytestmark = pytest.mark.integration

TABLES = [relation("id", "v", name=f"t{n}", oid=16384 + n) for n in range(6)]


def rows(folder: Path) -> list[tuple[int, str]]:
    table = deltalake.DeltaTable(str(folder)).to_pyarrow_table().sort_by("id")
    return list(zip(table["id"].to_pylist(), table["v"].to_pylist(), strict=True))


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def inherited_mb(pid: int) -> int:
    """The memory a process shares with the one it was forked from and not yet changed (its
    shared dirty pages: the libraries' files it maps are shared with this process too), MB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Shared_Dirty:"):
            return int(line.split()[1]) // 1024
    return 0


def test_writer_processes_write_the_tables_the_threads_would(spark: Any, warehouse: Path) -> None:
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(writer_processes=2))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    processes = tables._merge_processes
    assert processes is not None
    try:
        first = batch(tx(*(ins(t, i, f"v{i}") for t in TABLES for i in range(1, 6)), end=100))
        applier.apply(first)
        second = batch(
            tx(*(upd(t, 1, "one") for t in TABLES), end=200),
            tx(*(dele(t, 2, None) for t in TABLES), *(ins(t, 9, "nine") for t in TABLES), end=300),
        )
        applier.apply(second)
        want = [(1, "one"), (3, "v3"), (4, "v4"), (5, "v5"), (9, "nine")]
        for t in TABLES:
            folder = warehouse / "public" / t.name
            assert rows(folder) == want, t.name
            assert writers(folder)[-1] == "pgsub"  # merged by pgsub's writer, in a process
            assert tables.applied_lsn(t.qualified_name) == Lsn(300)
        # Both processes had tables: each table always goes to the same one.
        assert len({processes._of(tables.path(t.qualified_name)) for t in TABLES}) == 2
        # Forked from a server that imported the writer's modules: their objects are shared
        # (about 70 MB; a process that imported them itself shares a few).
        inherited = [inherited_mb(pid) for pid in tables.writer_pids()]
        assert all(mb >= 30 for mb in inherited), inherited

        # The same batch again (a restart resends it): nothing committed twice.
        versions = {t.name: deltalake.DeltaTable(str(warehouse / "public" / t.name)).version()
                    for t in TABLES}  # fmt: skip
        fresh = BatchApplier("sub1", tables, lambda oid: None)
        try:
            fresh.apply(second)
        finally:
            fresh.close()
        for t in TABLES:
            table = deltalake.DeltaTable(str(warehouse / "public" / t.name))
            assert table.version() == versions[t.name]

        # Another engine commits to t0: its writer process reads that before its next write.
        deltalake.write_deltalake(
            str(warehouse / "public" / "t0"),
            pa.table({"id": pa.array([50], pa.int32()), "v": ["theirs"]}),
            mode="append",
        )
        applier.apply(batch(tx(upd(TABLES[0], 3, "three"), end=400)))
        assert rows(warehouse / "public" / "t0") == [
            (1, "one"), (3, "three"), (4, "v4"), (5, "v5"), (9, "nine"), (50, "theirs")
        ]  # fmt: skip
    finally:
        started = tables.writer_pids()
        applier.close()
        tables.close()
    assert len(started) == 2 and not any(map(alive, started))


@contextlib.contextmanager
def one_process(
    spark: Any, warehouse: Path, t: Relation
) -> Iterator[tuple[DeltaTables, BatchApplier, MergeProcesses]]:
    """A daemon's tables with one writer process, holding ``t``'s rows 1-3 (LSN 100): the
    tables, their applier and their process; no process left after."""
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(writer_processes=1))
    applier = BatchApplier("sub1", tables, lambda oid: None)
    processes = tables._merge_processes
    assert processes is not None
    try:
        applier.apply(batch(tx(*(ins(t, i, f"v{i}") for i in range(1, 4)), end=100)))
        yield tables, applier, processes
    finally:
        started = tables.writer_pids()
        applier.close()
        tables.close()
    assert started and not any(map(alive, started))


def the_process(processes: MergeProcesses) -> tuple[Any, BaseProcess, int]:
    """The one writer process's shard, the process, running, and its pid."""
    (shard,) = processes._shards
    process = shard._process
    assert process is not None and process.pid is not None
    return shard, process, process.pid


def test_a_writer_process_that_dies_fails_its_writes_and_starts_again(
    spark: Any, warehouse: Path
) -> None:
    t = TABLES[0]
    with one_process(spark, warehouse, t) as (tables, applier, processes):
        shard, process, pid = the_process(processes)
        # Stopped, then killed with a write in it: that write fails, nothing is confirmed.
        os.kill(pid, signal.SIGSTOP)
        again = batch(tx(upd(t, 1, "one"), end=200))
        failed: list[BaseException] = []

        def apply() -> None:
            try:
                applier.apply(again)
            except Exception as exc:
                failed.append(exc)

        writing = threading.Thread(target=apply)
        writing.start()
        wait_until(lambda: bool(shard._waiting), timeout=60, what="the write sent")
        os.kill(pid, signal.SIGKILL)
        writing.join(timeout=120)
        assert not writing.is_alive()
        assert len(failed) == 1 and "writer process 0 exited" in str(failed[0]), failed
        assert tables.applied_lsn(t.qualified_name) == Lsn(100)
        applier.apply(again)  # the process started again; the batch written once
        assert rows(warehouse / "public" / t.name) == [(1, "one"), (2, "v2"), (3, "v3")]
        assert shard._process is not None and shard._process.pid != process.pid


def test_a_warm_is_not_waited_for_and_the_tables_next_merge_runs_after_it(
    spark: Any, warehouse: Path
) -> None:
    t = TABLES[1]
    with one_process(spark, warehouse, t) as (tables, applier, processes):
        shard, process, pid = the_process(processes)
        os.kill(pid, signal.SIGSTOP)  # the process answers nothing meanwhile
        try:
            warming = threading.Thread(
                target=processes.warm,
                args=(tables.path(t.qualified_name), target_schema(t, lambda oid: None, True)),
            )
            warming.start()
            warming.join(timeout=60)
            assert not warming.is_alive()  # sent, not waited for (the copy lets go of its table)
            assert len(shard._waiting) == 1
            writing = threading.Thread(
                target=applier.apply, args=(batch(tx(upd(t, 1, "one"), end=200)),)
            )
            writing.start()
            wait_until(lambda: len(shard._waiting) == 2, timeout=60, what="the merge sent")
        finally:
            os.kill(pid, signal.SIGCONT)
        writing.join(timeout=120)
        assert not writing.is_alive()
        assert not shard._waiting  # both answered
        assert rows(warehouse / "public" / t.name) == [(1, "one"), (2, "v2"), (3, "v3")]
        assert tables.applied_lsn(t.qualified_name) == Lsn(200)
        assert shard._process is process  # the same process, never stopped


def test_writer_processes_start_with_the_subscription_and_none_outlives_close(
    spark: Any, warehouse: Path
) -> None:
    tables = DeltaTables(spark, str(warehouse), "sub1", TableOptions(writer_processes=2))
    try:
        tables.start_writers(1)  # in the background, before any table asks; a set number
        wait_until(lambda: len(tables.writer_pids()) == 2, timeout=120, what="both started")
        started = tables.writer_pids()
    finally:
        tables.close()
    assert not any(map(alive, started))


def _apply(tables: DeltaTables, *transactions: Any) -> None:
    applier = BatchApplier("sub1", tables, lambda oid: None)
    try:
        applier.apply(batch(*transactions))
    finally:
        applier.close()


def test_auto_starts_two_processes_for_many_tables_and_none_for_a_few(
    spark: Any, warehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``writer_processes: auto`` (the daemon's default) on a local warehouse: two processes
    for a subscription of ``AUTO_TABLES`` tables when two cores are usable; the threads write
    until both have started and opened the tables the threads wrote, then the processes
    write them; none for fewer tables, or on one core; chosen once."""
    monkeypatch.setattr(tables_state, "usable_cpus", lambda: 2)
    auto = TableOptions(writer_processes="auto")
    few = DeltaTables(spark, str(warehouse / "few"), "sub1", auto)
    many = DeltaTables(spark, str(warehouse / "many"), "sub1", auto)
    try:
        for tables in (few, many):  # before the choice (the first start's copies): threads
            _apply(tables, tx(*(ins(t, 1, "one") for t in TABLES), end=100))
        assert len(many._local_merges._open) == len(TABLES)
        with capture_logs() as logs:
            few.start_writers(AUTO_TABLES - 1)
            many.start_writers(AUTO_TABLES)
            wait_until(
                lambda: any(e["event"] == "tables written by writer processes" for e in logs),
                timeout=120,
                what="both started, the tables opened in them",
            )
        chosen = [
            (e["tables"], e["processes"]) for e in logs if e["event"] == "writer processes chosen"
        ]
        assert chosen == [(AUTO_TABLES - 1, 0), (AUTO_TABLES, 2)]
        (taken,) = [e for e in logs if e["event"] == "tables written by writer processes"]
        assert taken["opened"] == len(TABLES)
        assert len(many.writer_pids()) == 2 and few.writer_pids() == []
        assert not many._local_merges._open  # let go: the processes hold them now
        for tables in (few, many):
            _apply(
                tables,
                tx(
                    *(upd(t, 1, "uno") for t in TABLES),
                    *(ins(t, 2, "two") for t in TABLES),
                    end=200,
                ),
            )
        for t in TABLES:
            assert rows(warehouse / "many" / "public" / t.name) == [(1, "uno"), (2, "two")]
            assert rows(warehouse / "few" / "public" / t.name) == [(1, "uno"), (2, "two")]
            assert many.applied_lsn(t.qualified_name) == Lsn(200)
        # Merged in the processes: the apply process opened none of the many's tables again.
        assert not many._local_merges._open and len(few._local_merges._open) == len(TABLES)
        started = many.writer_pids()
        many.start_writers(1)  # chosen once: the same processes go on
        assert many.writer_pids() == started
    finally:
        few.close()
        many.close()
    monkeypatch.setattr(tables_state, "usable_cpus", lambda: 1)
    one_core = DeltaTables(spark, str(warehouse / "one"), "sub1", auto)
    one_core.start_writers(1_000)
    assert one_core.writer_pids() == []
