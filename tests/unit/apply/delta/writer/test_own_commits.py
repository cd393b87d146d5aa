"""pgsub's own commits (apply/delta/writer/overwrite.py) on a local folder
(apply/delta/files/store.py):
put-if-absent, durable before they are named, and never a committed file removed."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from apply.columns.schema import TargetSchema
from apply.core.errors import CommitRacedError
from apply.core.records import CommitMark
from apply.delta.files.local_store import _FOLDER_SYNCS, LocalStore, folders_synced_together
from apply.delta.files.store import commit_name
from apply.delta.writer.durability import Durability
from apply.delta.writer.live_files import make_durable
from apply.delta.writer.open_table import OpenTable
from apply.delta.writer.overwrite import append, commit, overwrite
from apply.delta.writer.vector_write import (
    REPLAY_REFUSES,
    VECTOR_READS,
    VECTOR_WRITES,
    vector_writable,
)
from subscriber.replication.lsn import Lsn
from tests.support.fsyncs import recorded_fsyncs

MARK = CommitMark("sub1", Lsn(100), 0)
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files and folders fsynced, in order."""
    return recorded_fsyncs(monkeypatch)


def _table(tmp_path: Path) -> Path:
    folder = tmp_path / "t"
    deltalake.write_deltalake(str(folder), ROWS)
    return folder


class _LinkedThenFailed(LocalStore):
    """A store whose commit lands, then fails (the temporary file's removal, an interrupt)."""

    def put_if_absent(self, name: str, data: bytes) -> bool:
        assert super().put_if_absent(name, data)
        raise OSError("the temporary file could not be removed")


def test_an_append_whose_commit_landed_keeps_its_files_whatever_fails_after(
    tmp_path: Path,
) -> None:
    """``append`` removed the data files on any exception after ``os.link``: the committed
    version then named files that were gone, and every reader failed on them."""
    folder = _table(tmp_path)
    store = _LinkedThenFailed(str(folder))
    with pytest.raises(OSError, match="could not be removed"):
        append(store, 0, ROWS.to_batches(), ROWS.schema, MARK)
    table = deltalake.DeltaTable(str(folder))
    assert table.version() == 1
    assert table.to_pyarrow_table().num_rows == 6  # every file the commit names is there


def test_an_append_that_lost_the_race_removes_only_its_own_files(tmp_path: Path) -> None:
    folder = _table(tmp_path)
    deltalake.write_deltalake(str(folder), ROWS, mode="append")  # version 1, by another
    before = sorted(p.name for p in folder.glob("*.parquet"))
    with pytest.raises(CommitRacedError):
        append(LocalStore(str(folder)), 0, ROWS.to_batches(), ROWS.schema, MARK)
    assert sorted(p.name for p in folder.glob("*.parquet")) == before
    assert not list((folder / "_delta_log").glob(".*"))  # no temporary file left


def test_a_commit_is_put_once_and_durable_before_and_after_it_is_named(
    tmp_path: Path, synced: list[str]
) -> None:
    folder = _table(tmp_path)
    store = LocalStore(str(folder))
    synced.clear()
    live = OpenTable(store, deltalake.DeltaTable(str(folder))).files()
    written, _, _ = overwrite(store, 0, live, ROWS, MARK)
    data, log = str(folder / written.name), str(folder / "_delta_log")
    assert synced[0] == data  # the data file, before the commit that names it
    assert synced[1].startswith(f"{log}/.00000000000000000001.json.")  # the commit, whole
    assert synced[2:] == [log, str(folder)]  # then the names
    assert not store.put_if_absent(commit_name(1), b"{}\n")  # never twice
    with pytest.raises(CommitRacedError):
        commit(store, 1, [{"commitInfo": {}}])
    assert deltalake.DeltaTable(str(folder)).to_pyarrow_table().num_rows == 3


def test_a_batchs_commits_name_their_folders_durable_together_at_its_end(
    tmp_path: Path, synced: list[str]
) -> None:
    """Within ``folders_synced_together`` (a batch's writes, on their own threads) each
    commit's files and commit file are fsynced before it is linked, and the folders naming
    them once, when the block ends - also when it raises."""
    folders = [_table(tmp_path / str(n)) for n in range(3)]
    stores = [LocalStore(str(folder)) for folder in folders]
    synced.clear()
    with folders_synced_together(), ThreadPoolExecutor(3) as pool:
        runs = [
            pool.submit(copy_context().run, append, store, 0, ROWS.to_batches(), ROWS.schema, MARK)
            for store in stores
        ]
        for run in runs:
            run.result()
        assert not any(Path(name).is_dir() for name in synced)  # files only, so far
        assert sum(".00000000000000000001.json." in name for name in synced) == 3
        made = list(synced)
    logs = {str(folder / "_delta_log") for folder in folders}
    assert sorted(synced[len(made) :]) == sorted(logs | {str(f) for f in folders})
    for folder in folders:
        assert deltalake.DeltaTable(str(folder)).to_pyarrow_table().num_rows == 6

    synced.clear()
    with pytest.raises(RuntimeError, match="a later table failed"), folders_synced_together():
        append(stores[0], 1, ROWS.to_batches(), ROWS.schema, MARK)
        assert str(folders[0]) not in synced
        raise RuntimeError("a later table failed")
    # fsynced side by side on the pool's threads: in either order
    assert sorted(synced[-2:]) == sorted([str(folders[0] / "_delta_log"), str(folders[0])])

    synced.clear()
    append(stores[1], 1, ROWS.to_batches(), ROWS.schema, MARK)  # outside: at its commit
    assert synced[-2:] == [str(folders[1] / "_delta_log"), str(folders[1])]


def test_a_batchs_folders_are_fsynced_on_threads_started_once(
    tmp_path: Path, synced: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch makes its ended writes durable every 50 ms while it is written: the threads
    that fsync its folders are started once, not for each call (over 200 tables a pool
    made per call kept the apply thread starting threads)."""
    stores = [LocalStore(str(_table(tmp_path / str(n)))) for n in range(4)]

    def batch(version: int) -> None:
        with folders_synced_together():
            for store in stores:
                append(store, version, ROWS.to_batches(), ROWS.schema, MARK)

    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    synced.clear()
    for version in range(5):  # each batch builds on the last
        batch(version)
    # Eight folders a batch: a pool per call started its threads again each time (24 here).
    assert len([t for t in started if t.name.startswith("folder-sync")]) <= _FOLDER_SYNCS
    assert sum(Path(name).is_dir() for name in synced) == 5 * 8  # each log's and table's
    for store in stores:
        assert deltalake.DeltaTable(store.folder).version() == 5


def test_a_replaced_file_and_its_name_are_durable_before_the_next_is_replaced(
    tmp_path: Path, synced: list[str]
) -> None:
    """A checkpoint, then ``_last_checkpoint`` naming it: after a power loss the second
    never names a checkpoint whose name was lost - also within a batch's block, which
    otherwise leaves folders to its end."""
    folder = _table(tmp_path)
    store = LocalStore(str(folder))
    log = str(folder / "_delta_log")
    synced.clear()
    with folders_synced_together():
        store.replace("_delta_log/00000000000000000000.checkpoint.parquet", b"PAR1")
        store.replace("_delta_log/_last_checkpoint", b'{"version": 0}')
        assert len(synced) == 4
    assert synced[0].startswith(f"{log}/.00000000000000000000.checkpoint.parquet.")
    assert synced[1] == log  # its name, before the next file is written
    assert synced[2].startswith(f"{log}/._last_checkpoint.")
    assert synced[3] == log
    assert (folder / "_delta_log" / "_last_checkpoint").read_bytes() == b'{"version": 0}'
    assert not list((folder / "_delta_log").glob(".*"))  # no temporary file left


def test_another_engines_commit_is_made_durable_with_its_files(
    tmp_path: Path, synced: list[str]
) -> None:
    folder = _table(tmp_path)
    deltalake.write_deltalake(str(folder), ROWS, mode="append")
    synced.clear()
    make_durable(LocalStore(str(folder)), 1)
    added = {
        str(Path(u.removeprefix("file://"))) for u in deltalake.DeltaTable(str(folder)).file_uris()
    }
    assert str(folder / "_delta_log" / f"{1:020d}.json") in synced
    assert {str(folder), str(folder / "_delta_log")} <= set(synced)
    assert len(added & set(synced)) == 1  # the file version 1 added (not version 0's)


def _protocol(reader: list[str], writer: list[str]) -> Any:
    """A table as ``vector_writable`` asks it: its protocol, properties and schema."""
    protocol = SimpleNamespace(
        min_reader_version=3, min_writer_version=7, reader_features=reader, writer_features=writer
    )
    metadata = SimpleNamespace(
        configuration={"delta.enableDeletionVectors": "true"}, partition_columns=[]
    )
    schema = deltalake.Schema.from_arrow(ROWS.schema)
    return SimpleNamespace(
        protocol=lambda: protocol, metadata=lambda: metadata, schema=lambda: schema
    )


def test_a_table_with_v2_checkpoints_is_never_written_by_the_vector_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pgsub's log replay does not read V2 checkpoints; the guard says so by name, and holds
    even if the features the vector path writes grow to include it."""
    schema = TargetSchema("public.t", (), ("id",))
    dv = ["deletionVectors"]
    assert vector_writable(_protocol(dv, dv), schema)
    assert not vector_writable(_protocol([*dv, "v2Checkpoint"], [*dv, "v2Checkpoint"]), schema)
    monkeypatch.setattr(
        "apply.delta.writer.vector_write.VECTOR_WRITES", VECTOR_WRITES | REPLAY_REFUSES
    )
    monkeypatch.setattr(
        "apply.delta.writer.vector_write.VECTOR_READS", VECTOR_READS | REPLAY_REFUSES
    )
    assert not vector_writable(_protocol([*dv, "v2Checkpoint"], [*dv, "v2Checkpoint"]), schema)


def test_every_commit_since_the_last_settled_one_is_made_durable(
    tmp_path: Path, synced: list[str]
) -> None:
    """A batch's commit by delta-rs, and the maintenance commit before it that it builds on:
    both durable before the batch is confirmed (a lost one under a durable one is a gap)."""
    folder = _table(tmp_path)
    durability = Durability(local=True)
    durability.known(str(folder), 0)
    deltalake.write_deltalake(str(folder), ROWS, mode="append")  # maintenance's, say
    deltalake.write_deltalake(str(folder), ROWS, mode="append")  # the batch's
    synced.clear()
    durability.settle(str(folder), 2)
    log = folder / "_delta_log"
    assert [s for s in synced if s.endswith(".json")] == [
        str(log / f"{1:020d}.json"),
        str(log / f"{2:020d}.json"),
    ]
    assert len([s for s in synced if s.endswith(".parquet")]) == 2
    synced.clear()
    durability.settle(str(folder), 2)
    assert synced == []  # settled once
    Durability(local=False).settle(str(folder), 2)
    assert synced == []  # on object storage a PUT is durable when it returns


def test_what_a_batch_reads_of_the_snapshot_is_kept_until_the_snapshot_moves(
    tmp_path: Path,
) -> None:
    folder = _table(tmp_path)
    open_table = OpenTable(LocalStore(str(folder)), deltalake.DeltaTable(str(folder)))
    reads: list[int] = []

    def read(table: deltalake.DeltaTable) -> int:
        reads.append(table.version())
        return len(reads)

    assert open_table.fact("k", read) == open_table.fact("k", read) == 1
    assert open_table.arrow_schema == pa.schema([("id", pa.int64())])
    assert "user.note" not in open_table.configuration
    open_table.wrote("sub1", 1, by_own=True)  # pgsub's own commit: properties unchanged
    assert open_table.fact("k", read) == 1
    # Another engine sets a property: read once the snapshot is brought up to it.
    deltalake.DeltaTable(str(folder)).alter.set_table_properties(
        {"user.note": "x"}, raise_if_not_exists=False
    )
    assert "user.note" not in open_table.configuration  # the snapshot has not moved
    assert open_table.synced().version() == 1
    assert open_table.configuration["user.note"] == "x"
    assert open_table.fact("k", read) == 2
    open_table.wrote("sub1", 2)  # a commit by delta-rs moved the snapshot
    assert open_table.fact("k", read) == 3
