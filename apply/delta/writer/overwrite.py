"""A small table overwritten by one commit that pgsub writes itself (Delta's protocol).

delta-rs takes 8-9 ms to overwrite a 2,000-row table (its writer plan, its
commit), pyarrow 0.7 ms to write the same rows as Parquet: at 200 tables a
batch, that is most of the batch (docs/performance.md, "Many tables"). The
commit of an overwrite is the simplest the protocol has, so pgsub writes it:

1. the rows as one Parquet file in the table's folder (pyarrow), durable
   before the commit names it (``apply.delta.files.store``);
2. ``_delta_log/<version + 1>.json``, put only if no other writer made
   that version first (``TableStore.put_if_absent``: Delta's "mutual
   exclusion"): a ``remove`` of every live file, the ``add`` of the new
   one (its statistics as delta-rs's writer gives them, ``apply.delta.writer.file_stats``:
   data skipping by key needs them, and delta-rs skips a file a filter's
   column has no bounds in), the batch's ``txn`` and a
   ``commitInfo``
   with its ``userMetadata`` and a ``txnId`` of its own;
3. every ``delta.checkpointInterval`` commits (100 unless set), a
   checkpoint and the removal of expired log files: pgsub's own, from the
   commits it made (``apply.delta.writer.checkpoint.keep_log_of``), else
   by delta-rs (``keep_log``; the caller asks for them). Each table checkpoints at
   versions of its own (``checkpoint_due``): the tables one batch writes
   reach the same version together, and 200 checkpoints in one batch
   stalled it 6 s where a batch took 0.7 (docs/performance.md, "Many
   tables").

The same commit adds files without removing any for a large transaction
that only inserts (``append``: files written a batch at a time, so memory
stays one batch whatever the transaction's size, with the same
statistics), and makes a table's version 0 with its first rows: a copy
into a table whose creation was held back for it
(``apply.delta.writer.creation.HeldCreation``).

Only for a table whose protocol asks nothing more of a writer
(``hand_writable``): no column invariants, not append-only, no table
feature. Another writer's commit in between is a ``CommitRacedError`` and
nothing is committed (the Parquet file is removed). Any other failure
leaves the files it wrote where they are: the commit may have been made
(the temporary file's removal failing after the link, an interrupt), and
removing a file a commit names would leave every reader failing on it; a
file no commit names is removed by the next full VACUUM.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.parquet as pq

from apply.core.errors import CommitRacedError
from apply.delta.files.store import LOG, TableStore, arrow_stream, commit_name, parquet_file
from apply.delta.writer.file_stats import FileStats
from apply.delta.writer.open_table import LiveFile

if TYPE_CHECKING:
    import deltalake

    from apply.core.records import CommitMark

ENGINE: Final = "pgsub"
# The table features pgsub's own commits may meet in a table's protocol (``hand_appendable``).
HAND_READS: Final = frozenset({"timestampNtz"})
HAND_WRITES: Final = frozenset({"timestampNtz", "appendOnly", "invariants"})
_CHECKPOINT_INTERVAL: Final = 100  # delta.checkpointInterval's default
APPEND_FILE_ROWS: Final = 1_000_000  # rows a file of ``append``: a few dozen MB


def hand_writable(table: deltalake.DeltaTable, rows: pa.Table) -> bool:
    """Whether pgsub may write ``rows`` over ``table`` by its own commit: the table's
    protocol asks nothing of a writer beyond writing its files (``hand_appendable``) and no
    column that may not be null holds a null."""
    if not hand_appendable(table):
        return False
    return all(
        field.get("nullable", True) or not rows.column(field["name"]).null_count
        for field in json.loads(table.schema().to_json())["fields"]
    )


def hand_appendable(table: deltalake.DeltaTable, nullable: bool = False) -> bool:
    """Whether pgsub may add files to ``table`` by its own commit (``append``): its protocol
    asks nothing of a writer beyond writing its files - the legacy protocol of a plain
    table (reader 1, writer at most 2), or reader 3 / writer 7 listing no feature but
    ``timestampNtz`` (its columns written as Parquet timestamps not adjusted to UTC, as
    pyarrow writes them) and the legacy ones Spark lists with it, unused: not append-only,
    no ``delta.invariants`` on a column; with ``nullable``, every column may also hold
    null (rows not seen yet can)."""
    protocol = table.protocol()
    legacy = protocol.min_reader_version <= 1 and protocol.min_writer_version <= 2
    features = protocol.min_reader_version == 3 and protocol.min_writer_version == 7
    if not legacy and not (
        features
        and set(protocol.reader_features or ()) <= HAND_READS
        and set(protocol.writer_features or ()) <= HAND_WRITES
    ):
        return False
    metadata = table.metadata()
    if metadata.partition_columns:
        return False
    if metadata.configuration.get("delta.appendOnly", "false").lower() == "true":
        return False
    for field in json.loads(table.schema().to_json())["fields"]:
        if "delta.invariants" in (field.get("metadata") or {}):
            return False
        if nullable and not field.get("nullable", True):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Appended:
    """What ``append`` wrote: rows, the bytes of its files and commit, its files."""

    rows: int
    size: int  # files and commit
    files: int
    data_size: int  # files alone


def append(
    store: TableStore,
    version: int,
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    mark: CommitMark,
    file_rows: int = APPEND_FILE_ROWS,
    *,
    replacing: list[LiveFile] | None = None,
    creating: list[dict[str, object]] | None = None,
) -> Appended:
    """``batches`` added to the table in ``store`` (latest version ``version``) as files of
    up to ``file_rows`` rows, written a batch at a time, in one commit carrying ``mark``,
    each file with the statistics of ``apply.delta.writer.file_stats``. ``replacing``: the
    live files the commit removes (a copy that replaces the table's rows: an overwrite
    streamed a batch at a time). ``creating``: the ``protocol`` and ``metaData`` of a
    table not made yet (``version`` -1), its version 0 made by this commit, as Spark's
    CREATE TABLE AS SELECT makes it."""
    names: list[str] = []
    adds: list[dict[str, object]] = []
    rows = size = 0
    with contextlib.ExitStack() as open_file:
        writer: pq.ParquetWriter | None = None
        stream: pa.NativeFile | None = None
        stats = FileStats(schema)
        for batch in batches:
            if writer is None:
                names.append(f"part-{len(names):05d}-{uuid.uuid4()}-c000.snappy.parquet")
                file = open_file.enter_context(store.writing(names[-1]))
                stream = open_file.enter_context(arrow_stream(file))
                writer = pq.ParquetWriter(stream, schema, compression="snappy")
            writer.write_batch(batch)
            stats.add(batch)
            if stats.rows >= file_rows:
                writer.close()
                assert stream is not None
                adds.append(_add(names[-1], stream.tell(), stats))
                size += stream.tell()
                open_file.close()  # the file written to its end, then durable
                writer, stream = None, None
                rows, stats = rows + stats.rows, FileStats(schema)
        if writer is not None and stream is not None:
            writer.close()
            adds.append(_add(names[-1], stream.tell(), stats))
            size += stream.tell()
            rows += stats.rows
    metrics = {
        "numFiles": str(len(adds)),
        "numOutputRows": str(rows),
        "numOutputBytes": str(size),
    }
    now = _now()
    if creating is None:
        mode = "Append" if replacing is None else "Overwrite"
        actions = opening_actions("WRITE", {"mode": mode}, metrics, mark, now)
    else:
        actions = opening_actions(
            "CREATE TABLE AS SELECT", {"partitionBy": "[]"}, metrics, mark, now
        )
        actions += creating
    actions += [_remove(file, now) for file in replacing or ()]
    data_size = size
    try:
        size += commit(store, version + 1, actions + adds)
    except CommitRacedError:
        for name in names:
            store.delete(name)
        raise
    return Appended(rows, size, len(adds), data_size)


def _add(name: str, size: int, stats: FileStats) -> dict[str, object]:
    return {
        "add": {
            "path": name,
            "partitionValues": {},
            "size": size,
            "modificationTime": _now(),
            "dataChange": True,
            "stats": stats.json(),
        }
    }


def _now() -> int:
    return int(time.time() * 1000)


def overwrite(
    store: TableStore,
    version: int,
    live: list[LiveFile],
    rows: pa.Table,
    mark: CommitMark,
    before_commit: Callable[[], None] = lambda: None,
) -> tuple[LiveFile, int, list[dict[str, object]]]:
    """``rows`` as the whole table in ``store``, whose latest version is ``version`` and
    live files ``live``, in one commit carrying ``mark``: the new file, the bytes written
    (it and the commit) and the commit's actions. ``before_commit``: called once the file
    is written, before its commit (a ``CommitRacedError`` from it: the file deleted,
    nothing committed)."""
    name, size = parquet_file(store, rows)
    now = int(time.time() * 1000)
    actions = opening_actions(
        "WRITE",
        {"mode": "Overwrite"},
        {"numFiles": "1", "numOutputRows": str(rows.num_rows), "numOutputBytes": str(size)},
        mark,
        now,
    )
    actions += [_remove(file, now) for file in live]
    stats = FileStats(rows.schema)
    for batch in rows.to_batches():
        stats.add(batch)
    actions.append(
        {
            "add": {
                "path": name,
                "partitionValues": {},
                "size": size,
                "modificationTime": now,
                "dataChange": True,
                "stats": stats.json(),
            }
        }
    )
    try:
        before_commit()
        written = size + commit(store, version + 1, actions)
    except CommitRacedError:
        store.delete(name)
        raise
    return LiveFile(name, name, size, rows.num_rows), written, actions


def _remove(file: LiveFile, now: int) -> dict[str, object]:
    return {
        "remove": {
            "path": file.log_path,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": {},
            "size": file.size,
        }
    }


def opening_actions(
    operation: str,
    parameters: dict[str, str],
    metrics: dict[str, str],
    mark: CommitMark,
    now: int,
) -> list[dict[str, object]]:
    """A pgsub commit's first actions: its ``commitInfo`` (the ``operation`` as Spark's
    history shows it, with the batch's ``userMetadata``) and the batch's ``txn``."""
    app_id, batch_version = mark.txn
    info = {
        "timestamp": now,
        "operation": operation,
        "operationParameters": parameters,
        "operationMetrics": metrics,
        "engineInfo": ENGINE,
        "clientVersion": ENGINE,
        "userMetadata": mark.user_metadata(),
        "txnId": str(uuid.uuid4()),
    }
    return [
        {"commitInfo": info},
        {"txn": {"appId": app_id, "version": batch_version, "lastUpdated": now}},
    ]


def checkpoint_due(version: int, properties: Mapping[str, str], location: str) -> bool:
    """Whether the table at ``location`` checkpoints at ``version``: once every checkpoint
    interval, at a version shifted by an amount of its own (from its folder's name), so that
    tables written by the same batches do not all checkpoint in one. A reader may find a
    checkpoint at any version."""
    interval = max(int(properties.get("delta.checkpointInterval") or _CHECKPOINT_INTERVAL), 1)
    shift = zlib.crc32(location.rstrip("/").encode()) % interval
    return (version + shift) % interval == 0


def keep_log(table: deltalake.DeltaTable, location: str) -> None:
    """After a commit pgsub made (by hand, or by delta-rs with ``NO_CHECKPOINT``): the
    table's checkpoint, and the removal of its expired log files, if its version is due."""
    if checkpoint_due(table.version(), table.metadata().configuration, location):
        table.create_checkpoint()
        table.cleanup_metadata()


def checkpoint_again(store: TableStore, version: int) -> bool:
    """The checkpoint at ``version`` made anew from the log as it is now, after the commit
    pgsub made at that version was found replaced by another engine's (Spark's LogStore on
    a local folder renames its commit over a version it found free): pgsub's checkpoint,
    written right after its commit, holds that commit's state, and every reader starting
    from it would see rows the log no longer has and miss the other engine's commit.

    False when there is no checkpoint at ``version``, or the log before it is gone
    (expired commits removed after it), and it stays as it is. The checkpoint is removed
    before it is made again: a reader meanwhile starts from the one before it."""
    import deltalake

    names = set(store.listed(LOG))
    own = f"{LOG}/{version:020d}.checkpoint.parquet"
    if own not in names:
        return False
    checkpoints = [
        int(base[:20])
        for base in (name[len(LOG) + 1 :] for name in names)
        if ".checkpoint." in base and base[:20].isdigit()
    ]
    since = max((v for v in checkpoints if v < version), default=-1)
    if any(commit_name(v) not in names for v in range(since + 1, version + 1)):
        return False
    store.delete(own)
    with contextlib.suppress(FileNotFoundError, ValueError):
        last = json.loads(store.read(f"{LOG}/_last_checkpoint"))
        if last.get("version") == version:
            store.delete(f"{LOG}/_last_checkpoint")
    options = dict(store.options)
    deltalake.DeltaTable(
        store.location, version=version, storage_options=options
    ).create_checkpoint()
    return True


def commit(store: TableStore, version: int, actions: list[dict[str, object]]) -> int:
    """``actions`` as the log's ``version`` of the table in ``store``, whole, durable and
    only if it is not there yet (a ``CommitRacedError`` if it is); the commit file's
    bytes."""
    text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()
    if not store.put_if_absent(commit_name(version), text):
        raise CommitRacedError(
            f"another writer committed version {version} of {store.location} first"
        )
    return len(text)
