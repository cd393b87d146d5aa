"""A big table's batch written by pgsub with deletion vectors: no MERGE, no scan.

A Spark MERGE into a 10M-row table read the whole table for every batch:
random keys touch every file, so no file's statistics let it skip one
(30-90 s a batch on this machine; docs/performance.md, "Big tables"). On a
local warehouse, a table with deletion vectors on takes this path instead:

1. ``KeyIndex`` keeps each live file's key column in memory, and which of
   its rows are alive (its deletion vector); it reads a file only when the
   file is new to it, and a vector only when another writer changed it.
   Files never change, so what it keeps is true as long as the log says
   the file is live. A key of several columns is kept as one string, the
   columns' text forms joined by NUL (``KeyIndex.key_of``);
2. the batch's keys are looked up in it: a binary search of an integer
   key, an Arrow set lookup of any other. A chain whose first change does
   not find what it expects is a conflict, and the batch then takes
   Spark's path, which judges and reports it;
3. the rows the batch replaces or deletes are added to their files'
   deletion vectors (one new vector file for the batch, written at the same
   time as the rest), the rows it leaves are written as one new Parquet
   file, each unsent TOAST value taken from the row it replaces; one commit, which pgsub writes
   (``apply.delta.writer.overwrite.commit``), carries the batch's marks;
4. once ``FOLD_AT`` small files are live (the earlier batches' files), the
   batch folds their alive rows into its own file and removes them, so the
   file count stays bounded without a compaction holding the table (a
   Spark OPTIMIZE of them took 26-38 s, and every batch waited); and a
   file whose rows its deletion vector has mostly removed (past
   ``PURGE_ABOVE``) is purged the same way, one a batch.

What a batch reads and writes follows the batch: its new rows, a vector per
touched file, one log entry. The price is memory: a table's key column
(8 bytes a row for a bigint key, 80 MB for 10M rows; a composite key's
text and 4 bytes) and a byte a row.

Only for tables whose protocol asks nothing more of a writer than deletion
vectors (``vector_writable``) and whose key columns have a text form that
is equal exactly when they are (``lookup_keys``); None from
``write_by_vectors`` means "take another path", nothing written.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from apply.batching.source import FIRST, PRESENT, KeyedSource
from apply.core.errors import CommitRacedError
from apply.core.maintenance_policy import PURGE_ABOVE
from apply.delta.files.store import TableStore, parquet_file
from apply.delta.writer import deletion_vectors
from apply.delta.writer.checkpoint import keep_log_of
from apply.delta.writer.deletion_vectors import Descriptor
from apply.delta.writer.file_stats import FileStats, loosened
from apply.delta.writer.kept_rows import KEPT, LARGEST
from apply.delta.writer.key_index import Alive, KeyIndex, Match
from apply.delta.writer.live_files import LiveFiles, VectorFile
from apply.delta.writer.overwrite import (
    commit,
    opening_actions,
)
from apply.delta.writer.protocol import VectorsOn
from apply.plans.merge_plan import expected_counts
from apply.plans.rewrite import found_as_expected, kept_values

if TYPE_CHECKING:
    import deltalake

    from apply.columns.schema import TargetSchema
    from apply.core.records import CommitMark, WriteResult
    from apply.delta.writer.open_table import OpenTable

# What a table's protocol may ask of its writers for pgsub to write it: deletion vectors,
# and the legacy features Spark lists beside them when it upgrades a table's protocol.
VECTOR_WRITES: Final = frozenset({"deletionVectors", "appendOnly", "invariants", "timestampNtz"})
VECTOR_READS: Final = frozenset({"deletionVectors", "timestampNtz"})
# What pgsub's own log replay (``apply.delta.writer.live_files``) cannot follow: V2 checkpoints
# (UUID-named, with sidecars). A table that lists it is never written by this path, whatever
# the two sets above come to hold.
REPLAY_REFUSES: Final = frozenset({"v2Checkpoint"})
# Each batch adds a small file; once FOLD_AT files below FOLD_BELOW bytes (together at most
# FOLD_MAX_BYTES) are live, the batch folds their alive rows into its own file and removes
# them: the table's file count stays bounded without a compaction that holds the table.
FOLD_AT: Final = 16
FOLD_BELOW: Final = 16 * 2**20
FOLD_MAX_BYTES: Final = 64 * 2**20
FOLD_TIER: Final = 256 * 2**10  # the first tier of small files: a few thousand rows
_KEY: Final = "__pgsub_key"  # the batch's keys, as the index holds them
# A file whose rows the deletion vectors have removed past PURGE_ABOVE (maintenance's OPTIMIZE
# share) and of at most PURGE_MAX_BYTES is purged by a batch: its alive rows rewritten into
# the batch's file, the file removed. One a batch, so that a batch costs one file's rewrite
# at most (about a second per 100 MB here).
PURGE_MAX_BYTES: Final = 256 * 2**20
# A batch's vectors go to a file even when small: Delta's inline vectors (``storageType`` ``i``,
# in the commit) would save a table's batch a file, but Spark's VACUUM (delta-spark 4.x,
# ``getDeletionVectorRelativePathAndSize``) fails on them with a scala.MatchError
# (docs/performance.md, "Inline deletion vectors, tried").
# The threads that PUT a batch's deletion vector file while its writer writes the rows' file:
# in an object store a table's batch is then three round trips in sequence, not four. As many
# as a batch's writers at most (``apply.delta.files.store_check.MAX_WRITERS``).
_PUTTING: Final = ThreadPoolExecutor(max_workers=32, thread_name_prefix="vector-put")


def vector_writable(table: deltalake.DeltaTable, schema: TargetSchema) -> bool:
    """Whether pgsub may write ``table``'s batches with deletion vectors itself: they are on,
    its protocol asks nothing more, no invariant or append-only rule, no partitions, a
    key."""
    properties = table.metadata().configuration
    if properties.get("delta.enableDeletionVectors", "false").lower() != "true":
        return False
    protocol = table.protocol()
    if protocol.min_writer_version < 7 or protocol.min_reader_version < 3:
        return False
    return vectors_allowed(table, schema)


def vectors_allowed(table: deltalake.DeltaTable, schema: TargetSchema) -> bool:
    """Whether ``table`` may be written by this path once deletion vectors are on
    (``apply.delta.writer.protocol.vectors_on`` turns them on): its protocol is the legacy one of
    a plain table (reader 1, writer 2 at most) or lists no feature beyond ``VECTOR_WRITES``
    and ``VECTOR_READS``; no invariant or append-only rule, no partitions, a key."""
    protocol = table.protocol()
    listed = {*(protocol.writer_features or ()), *(protocol.reader_features or ())}
    if listed & REPLAY_REFUSES:
        return False
    legacy = protocol.min_writer_version <= 2 and protocol.min_reader_version <= 1
    if not legacy and (protocol.min_writer_version < 7 or protocol.min_reader_version < 3):
        return False
    if not set(protocol.writer_features or ()) <= VECTOR_WRITES:
        return False
    if not set(protocol.reader_features or ()) <= VECTOR_READS:
        return False
    metadata = table.metadata()
    properties = metadata.configuration
    if properties.get("delta.appendOnly", "false").lower() == "true":
        return False
    if metadata.partition_columns or not schema.key:
        return False
    fields = json.loads(table.schema().to_json())["fields"]
    return not any("delta.invariants" in (f.get("metadata") or {}) for f in fields)


@dataclass
class VectorTable:
    """What the path keeps of one table between batches."""

    files: LiveFiles
    index: KeyIndex


def write_by_vectors(
    open_table: OpenTable,
    state: VectorTable,
    schema: TargetSchema,
    source: KeyedSource,
    mark: CommitMark,
    *,
    copy_on_write: bool = False,
    vectors_on: VectorsOn | None = None,
) -> WriteResult | None:
    """The batch ``source`` written into the open table with deletion vectors, in one
    commit carrying ``mark`` (and ``vectors_on``'s actions, which turn them on: the batch
    is the table's first with them); None: a conflict or a duplicate key (Spark's path,
    nothing written, vectors not turned on). With
    ``copy_on_write``, no vector: each file the batch touches is rewritten without the
    rows it replaces or deletes (folded into the batch's file, as small files are), so
    the table needs no deletion vectors - a large transaction's way into a table without
    them (``LocalMerges.merge_staged``), whose memory is its rows and the table's keys,
    not a MERGE's."""
    from apply.core.records import WriteResult

    keys = list(schema.key)
    state.files.read(open_table.version)
    live = state.files.files
    state.index.refresh(live)
    rows = source.table
    wanted = state.index.key_of(rows)
    matches, found = state.index.find(live, wanted)
    if len(found) != len(pc.unique(found)):
        return None  # a key the table holds twice: not a table pgsub keyed
    probe = pa.table({_KEY: wanted, FIRST: rows[FIRST]})
    if not found_as_expected(pa.table({_KEY: found}), probe, [_KEY]):
        return None
    have = open_table.arrow_schema
    staying = rows if pc.all(rows[PRESENT]).as_py() else rows.filter(rows[PRESENT])
    carried = tuple(name for name in have.names if name not in rows.schema.names)
    if (source.keep_columns or carried) and staying.num_rows:
        kept = [rows.schema.names[i] for i in source.keep_columns]
        old = _old_rows(open_table.store, matches, have, [*keys, *kept, *carried])
        staying = kept_values(staying, old, source.keep_columns, keys, carried)
    new_rows = staying.select(have.names).cast(have)
    for field in have:
        if not field.nullable and new_rows.column(field.name).null_count:
            return None  # Spark reports the NOT NULL violation
    folded = _to_fold(live, state.index, open_table.store.location, matches, copy_on_write)
    if folded:
        touched = {match.file.name: match.positions for match in matches}
        alive = [state.index.alive_after(f.name, touched.get(f.name)) for f in folded]
        copies = [_rows(open_table.store, f, a, have) for f, a in zip(folded, alive, strict=True)]
        new_rows = _joined(new_rows, [copy for copy in copies if copy.num_rows])
    app_id, batch_version = mark.txn
    version = open_table.version + 1
    counts = expected_counts(rows)
    written = _write(
        open_table.store,
        state.index,
        matches,
        new_rows,
        mark,
        counts=counts,
        folded=folded,
        opening=[] if vectors_on is None else vectors_on.actions,
    )
    try:
        open_table.confirm_latest()  # the log as read, asked while the files were written
        size = written.size + commit(open_table.store, version, written.actions)
    except CommitRacedError:
        for name in written.files:
            open_table.store.delete(name)
        raise
    state.files.applied(version, written.actions)
    left = {match.file.name for match, _ in written.vectors}
    KEPT.forget(open_table.store.location, (_names(matches) | _names_of(folded)) - left)
    for match, unique in written.vectors:
        state.index.committed(match.file.name, match.positions, unique)
    if written.new_file is not None:
        state.index.added(written.new_file, new_rows)
    open_table.wrote(app_id, batch_version, by_own=True, actions=written.actions)
    if vectors_on is not None:
        open_table.moved_on(vectors_on.facts)
    keep_log_of(open_table)
    return WriteResult(schema.table, version, *counts, written_bytes=size, durable=True)


@dataclass(frozen=True, slots=True)
class _Written:
    actions: list[dict[str, object]]
    files: list[str]  # what to remove if the commit is refused
    vectors: list[tuple[Match, str]]  # each file left with rows, and its new vector's id
    new_file: str | None
    size: int  # the bytes of its files (the rows' and the vectors')


def _write(
    store: TableStore,
    index: KeyIndex,
    matches: list[Match],
    rows: pa.Table,
    mark: CommitMark,
    *,
    counts: tuple[int, int, int],
    folded: list[VectorFile],
    opening: list[dict[str, object]],
) -> _Written:
    """The batch's files (its rows, its vectors) and the actions of its commit, whose
    metrics are named as a Spark MERGE's (``counts``: rows inserted, updated, deleted),
    ``opening`` after its ``commitInfo`` and ``txn``. ``folded`` files are removed:
    ``rows`` holds what is alive of them."""
    now = int(time.time() * 1000)
    files: list[str] = []
    gone = {file.name for file in folded}
    changes: list[dict[str, object]] = [_remove(match.file, now) for match in matches]
    changes += [_remove(file, now) for file in folded if file.name not in _names(matches)]
    kept: list[tuple[Match, npt.NDArray[np.uint64]]] = []
    for match in matches:
        if match.file.name in gone:
            continue
        deleted = index.deleted(match.file.name, match.positions)
        if len(deleted) < index.rows(match.file.name):
            kept.append((match, deleted))  # else every row is gone: the file goes
    vectors: list[tuple[Match, str]] = []
    vector_put: Future[int] | None = None
    if kept:
        bitmaps = [deletion_vectors.encode(deleted) for _, deleted in kept]
        body = deletion_vectors.file_body(bitmaps)
        vector_put = _PUTTING.submit(store.write, body.name, body.data)  # beside the rows'
        for (match, deleted), bitmap, offset in zip(kept, bitmaps, body.offsets, strict=True):
            vector = Descriptor("u", body.encoded, offset, len(bitmap), len(deleted))
            changes.append(_add_again(match.file, vector, index.rows(match.file.name)))
            vectors.append((match, vector.unique_id))
        files.append(body.name)
    new_file, size = None, 0
    try:
        if rows.num_rows:
            new_file, size = parquet_file(store, rows)
            files.append(new_file)
    finally:
        vector_bytes = vector_put.result() if vector_put is not None else 0
    if new_file is not None:
        KEPT.keep(store.location, new_file, rows)  # a later batch folds it (``kept_rows``)
        stats = FileStats(rows.schema)
        for batch in rows.to_batches():
            stats.add(batch)
        add = {"path": new_file, "partitionValues": {}, "size": size, "modificationTime": now}
        changes.append({"add": {**add, "dataChange": True, "stats": stats.json()}})
    inserted, updated, deleted_rows = counts
    was_vector = sum(1 for match in matches if match.file.vector is not None)
    metrics = {
        "numSourceRows": str(inserted + updated + deleted_rows),
        "numTargetRowsInserted": str(inserted),
        "numTargetRowsUpdated": str(updated),
        "numTargetRowsDeleted": str(deleted_rows),
        "numTargetRowsCopied": str(rows.num_rows - inserted - updated),
        "numOutputRows": str(rows.num_rows),
        "numTargetFilesAdded": str(1 if new_file else 0),
        "numTargetFilesRemoved": str(len(_names(matches) | gone) - len(kept)),
        "numTargetBytesAdded": str(size),
        "numTargetBytesRemoved": str(
            sum({f.name: f.size for f in [*(m.file for m in matches), *folded]}.values())
            - sum(m.file.size for m, _ in kept)
        ),
        "numTargetDeletionVectorsAdded": str(len(kept)),
        "numTargetDeletionVectorsRemoved": str(was_vector),
        "numTargetDeletionVectorsUpdated": str(min(was_vector, len(kept))),
    }
    predicate = {"predicate": "pgsub: the batch's keys, looked up in memory"}
    actions = opening_actions("MERGE", predicate, metrics, mark, now) + opening + changes
    return _Written(actions, files, vectors, new_file, size + vector_bytes)


def _to_fold(
    live: list[VectorFile],
    index: KeyIndex,
    location: str,
    matches: list[Match],
    copy_on_write: bool,
) -> list[VectorFile]:
    """The files a batch folds into its own: its tier of small files, if due; a worn file;
    with ``copy_on_write``, every file it touches too."""
    folded = _small_files(live, fold_at(location))
    worn = _worn_file(live, index, {f.name for f in folded})
    folded += [worn] if worn is not None else []
    if copy_on_write:
        folding = _names_of(folded)
        folded += [match.file for match in matches if match.file.name not in folding]
    return folded


def _joined(rows: pa.Table, copies: list[pa.Table]) -> pa.Table:
    """The batch's ``rows`` and the ``copies`` of what it folds, as one table: one chunk if
    small enough to be kept for a later fold (``kept_rows``: a table of many chunks made
    each later file's statistics and write slower); else as they are, not copied again
    (a large transaction's million rows would be held twice)."""
    if not copies:
        return rows
    joined = pa.concat_tables([rows, *copies])
    return joined.combine_chunks() if joined.nbytes <= LARGEST else joined


def _names(matches: list[Match]) -> set[str]:
    return {match.file.name for match in matches}


def _names_of(files: list[VectorFile]) -> set[str]:
    return {file.name for file in files}


def _tier(size: int) -> int:
    """A small file's tier: below ``FOLD_TIER`` bytes, 0; each next one ``FOLD_AT`` times
    larger."""
    return 0 if size < FOLD_TIER else 1 + int(math.log(size / FOLD_TIER, FOLD_AT))


def fold_at(location: str) -> int:
    """How many small files of one tier the table at ``location`` folds at: ``FOLD_AT`` to
    twice that, by a number of its own (its folder's name), so that tables written by the
    same batches do not all fold in one (200 folds in one batch stalled it 4 s where a
    batch took 1.5: docs/performance.md, "What a batch writes")."""
    return FOLD_AT + zlib.crc32(location.rstrip("/").encode()) % FOLD_AT


def _small_files(live: list[VectorFile], at: int = FOLD_AT) -> list[VectorFile]:
    """The files to fold into this batch's file: ``at`` or more of one tier (below
    ``FOLD_BELOW`` bytes each, at most ``FOLD_MAX_BYTES`` together), the lowest tier that
    has them; else none. Files of like size only: a file folded once is folded again only
    with its like, so a row is rewritten once per tier, not once per fold (folding the
    smallest sixteen whatever their sizes rewrote the growing folded file at every fold)."""
    tiers: dict[int, list[VectorFile]] = {}
    for file in live:
        if file.size < FOLD_BELOW:
            tiers.setdefault(_tier(file.size), []).append(file)
    for tier in sorted(tiers):
        small, total = [], 0
        for file in sorted(tiers[tier], key=lambda f: f.size):
            if total + file.size > FOLD_MAX_BYTES:
                break
            small.append(file)
            total += file.size
        if len(small) >= at:
            return small
    return []


def _worn_file(live: list[VectorFile], index: KeyIndex, folded: set[str]) -> VectorFile | None:
    """The file (of at most ``PURGE_MAX_BYTES``, not ``folded``) whose rows deletion vectors
    have removed most, past ``PURGE_ABOVE``: the batch rewrites its alive rows into its own
    file and removes it. Else every batch that touches it rewrites its ever larger vector,
    and every reader reads its removed rows, for as long as the table lives."""
    shares = [
        (file.vector.cardinality / max(1, index.rows(file.name)), file)
        for file in live
        if file.vector is not None and file.size <= PURGE_MAX_BYTES and file.name not in folded
    ]
    share, file = max(shares, key=lambda pair: pair[0], default=(0.0, None))
    return file if share > PURGE_ABOVE else None


def _rows(store: TableStore, file: VectorFile, alive: Alive, schema: pa.Schema) -> pa.Table:
    """The ``alive`` rows of ``file``, in the table's ``schema``."""
    import pyarrow.dataset as ds

    if not alive.any():
        return schema.empty_table()  # every row replaced: nothing to read

    rows = KEPT.get(store.location, file.name)  # this process wrote it a few batches ago
    if rows is None:
        rows = pq.ParquetFile(store.open(file.name, file.size)).read()  # 1/4 a dataset's time
    if rows.schema.names != schema.names or rows.schema.types != schema.types:
        files = [store.source(file.name)]  # another writer's layout or types: cast
        scan = ds.dataset(files, schema=schema, format="parquet", filesystem=store.filesystem)
        rows = scan.to_table()
    return rows.filter(pa.array(alive))


def _remove(file: VectorFile, now: int) -> dict[str, object]:
    """The ``remove`` of ``file`` as it is live (its path and its current vector)."""
    remove: dict[str, object] = {
        "path": file.path,
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": file.size,
    }
    if file.vector is not None:
        remove["deletionVector"] = file.vector.action()
    return {"remove": remove}


def _add_again(file: VectorFile, vector: Descriptor, rows: int) -> dict[str, object]:
    """The ``add`` of ``file`` again with ``vector``: its statistics kept, as bounds that
    may be wider than its alive rows' (``tightBounds``: false)."""
    stats = loosened(file.stats or "{}", rows)
    return {
        "add": {
            "path": file.path,
            "partitionValues": {},
            "size": file.size,
            "modificationTime": file.modification_time,
            "dataChange": True,
            "stats": stats,
            "deletionVector": vector.action(),
        }
    }


def _old_rows(
    store: TableStore, matches: list[Match], schema: pa.Schema, columns: list[str]
) -> pa.Table:
    """The ``columns`` of the rows the batch replaces, read from their files (only the row
    groups that hold them)."""
    names = list(dict.fromkeys(columns))
    wanted = pa.schema([schema.field(n) for n in names])
    parts = [wanted.empty_table()]
    for match in matches:
        parquet = pq.ParquetFile(store.open(match.file.name, match.file.size))
        sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
        starts = np.cumsum([0, *sizes])
        groups = np.unique(np.searchsorted(starts, match.positions, side="right") - 1)
        read = parquet.read_row_groups(groups.tolist(), columns=names)
        offsets = np.cumsum([0, *(sizes[g] for g in groups)])
        local_rows = np.concatenate(
            [
                match.positions[(match.positions >= starts[g]) & (match.positions < starts[g + 1])]
                - starts[g]
                + offsets[i]
                for i, g in enumerate(groups)
            ]
        )
        parts.append(read.take(pa.array(local_rows)).select(names).cast(wanted))
    return pa.concat_tables(parts)
