"""A keyed table's batch merged by delta-rs in this process: no Spark job, no JVM.

A Spark MERGE costs about a second whatever its size (its jobs, its commit's
snapshot and statistics: docs/performance.md, "Many tables"), so a batch
over many small tables paid a second per table. On a local warehouse, a
table that delta-rs may write (``delta_rs_can_write``) and whose files hold
at most ``LOCAL_MERGE_MAX_BYTES`` takes this path instead (steps 1-3 for one table:
``apply.delta.writer.delta_rs_merge``):

1. the commit already made? Delta's idempotent-write id
   (``txn``: ``mark.txn``) is read from the log, and a batch the table has
   is not merged twice (what Spark's ``txnAppId`` does);
2. the batch's keys are looked up in the table's key columns, read by
   pyarrow from its live files; a chain whose first change does not find
   what it expects (``conflicts.kinds.judge``) is a conflict, and the whole
   batch then takes Spark's path (``apply.delta.spark.keyed``), which judges,
   resolves and reports it - conflicts cost what they did, and their report
   is the same;
3. the same MERGE plan as Spark's (``apply.plans.merge_plan``, without its
   ``raise_error`` clause: nothing conflicts) is run by delta-rs, in one
   commit carrying the same mark (txn and ``userMetadata``).

A table of at most ``REWRITE_MAX_BYTES`` takes a shorter way for steps 2
and 3: its rows are read whole, the batch is applied to them in Arrow
(``apply.plans.rewrite``, which finds conflicts the same way) and the table is
overwritten in one commit with the same mark, which pgsub writes itself
where the table's protocol allows (``apply.delta.writer.overwrite``): 8 ms a table
of 2,000 rows against the MERGE's 35 (``benchmarks.local_merge_bench``).

A large transaction staged in pieces (``apply.plans.staging``) takes steps 1-3
too, its staged rows read whole, while they are at most
``STAGED_MAX_BYTES`` of Parquet (``LocalMerges.merge_staged``); one that
only inserts keys the table's files cannot hold (their key ranges say so)
is appended instead, streamed from its pieces whatever its size
(``LocalMerges.append_staged``).

A stamped table (``apply.history.stamps``: metadata columns, soft deletes) takes
steps 1-3 with its source stamped (and, with soft deletes, its marked rows
counted as absent in the lookup); never the rewrite or the deletion vector
path, which do not stamp rows.

None from ``LocalMerges.merge`` means "take Spark's path", and nothing was
written. Left to Spark: a TRUNCATE in the batch, an update that moved a
key with unchanged TOAST values (``fill_moved``), a table whose types
delta-rs would write differently, multiset tables, large tables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import structlog

from apply.batching.collapse import KeyedNet
from apply.batching.source import KeyedSource, keyed_source
from apply.core.errors import CommitRacedError, TargetTableError
from apply.core.features import PORTABLE, TableFeatures
from apply.core.records import CommitMark, WriteResult
from apply.delta.files.local_store import LocalStore
from apply.delta.files.store import TableStore, table_store
from apply.delta.writer.deletion_vectors import DeletionVectorError
from apply.delta.writer.delta_rs_merge import (
    LOCAL_MERGE_MAX_BYTES,
    fitting_size,
    merge_into,
    table_types,
)
from apply.delta.writer.key_index import KeyIndex, lookup_keys
from apply.delta.writer.key_lookup import keys_apart
from apply.delta.writer.live_files import LiveFiles, UnreadableLogError
from apply.delta.writer.local_tables import delta_rs_writes, marked, no_checkpoint
from apply.delta.writer.open_table import OpenTable
from apply.delta.writer.overwrite import (
    append,
    hand_appendable,
    keep_log,
)
from apply.delta.writer.protocol import VectorsOn, warn_gained
from apply.delta.writer.vector_write import (
    VectorTable,
    vector_writable,
    vectors_allowed,
    write_by_vectors,
)
from apply.delta.writer.vectors_pay import vectors_pay
from apply.history.stamps import Stamping, stamped
from apply.plans.staging import StagedSource

if TYPE_CHECKING:
    import deltalake

    from apply.columns.schema import TargetSchema

log = structlog.get_logger(__name__)

# Up to this much staged Parquet a large transaction is merged by delta-rs too (its staged
# pieces read into memory, a few times their size: about 90 MB a million rows of five
# columns); past it, by Spark, which streams them.
STAGED_MAX_BYTES: Final = 64 * 2**20
# The files of a staged append by delta-rs, which holds a few files' rows while it writes.
APPEND_FILE_BYTES: Final = 32 * 2**20


class LocalMerges:
    """Keyed batches merged by delta-rs, with each table's log kept open between batches.

    Opening a table replays its log (15 ms for a few dozen commits); an open
    table reads only the commits after its version (under 2 ms), and its own
    MERGE moves it forward. A table is used by one writer at a time
    (``DeltaTables.exclusive``). ``forget`` drops one whose folder was made
    anew (a table created again after it was deleted).
    """

    def __init__(
        self,
        max_bytes: int = LOCAL_MERGE_MAX_BYTES,
        store_of: Callable[[str], TableStore] | None = None,
        features: TableFeatures = PORTABLE,
    ) -> None:
        self.max_bytes = max_bytes  # a larger table's batches go to Spark
        self.features = features  # whether a batch may turn deletion vectors on (auto)
        # Where a table's files are, by its path (``apply.delta.files.store``).
        self._store_of = store_of or table_store
        self._open: dict[str, OpenTable] = {}
        self._vectors: dict[str, VectorTable] = {}  # tables written with deletion vectors
        self._lock = threading.Lock()

    def forget(self, path: str) -> None:
        location = self._store_of(path).location
        with self._lock:
            self._open.pop(location, None)
            self._vectors.pop(location, None)

    def merge(
        self,
        path: str,
        schema: TargetSchema,
        net: KeyedNet,
        mark: CommitMark,
        *,
        stamping: Stamping = Stamping.NONE,
    ) -> WriteResult | None:
        """``net`` merged into the table at ``path`` by delta-rs, in one commit carrying
        ``mark``; None when the batch must take Spark's path (nothing was written).
        ``stamping``: what the table's rows carry (``apply.history.stamps``)."""
        if net.truncated or any(row.toast_key is not None for row in net.rows.values()):
            return None
        source = keyed_source(net, schema)
        if stamping.stamps:
            rows = list(net.rows.values())
            source = replace(source, table=stamped(source.table, rows, net.commits))
        return self.merge_source(path, schema, source, mark, stamping=stamping)

    def merge_staged(
        self, path: str, schema: TargetSchema, stage: StagedSource, mark: CommitMark
    ) -> WriteResult | None:
        """A large transaction's staged pieces (``apply.plans.staging``) merged by delta-rs in one
        commit carrying ``mark``, when they are at most ``STAGED_MAX_BYTES`` of Parquet: a
        MERGE of a million rows takes delta-rs about a second where Spark's took seven.
        None: Spark's path (``apply.delta.spark.keyed.write_staged``), nothing written."""
        if stage.bytes > STAGED_MAX_BYTES:
            return None
        table = stage.read()
        return self.merge_source(
            path,
            schema,
            KeyedSource(table, tuple(sorted(stage.keep)), False),
            mark,
            by_positions=True,
        )

    def append_staged(
        self, path: str, schema: TargetSchema, stage: StagedSource, mark: CommitMark
    ) -> WriteResult | None:
        """A large transaction that only inserts, into a table that cannot hold its keys (no
        live file, or none whose key range meets the staged keys'), appended in one commit
        carrying ``mark``, streamed from the staged pieces: by pgsub's own commit where the
        table's protocol allows (``apply.delta.writer.overwrite.append``: memory stays one batch of
        rows whatever the transaction's size), else by delta-rs (which holds a few files'
        rows). None: not such a transaction or table (nothing written)."""
        import deltalake

        if stage.keep or stage.expected != (stage.rows, 0, 0):
            return None  # some row is not an insert of an absent key
        with self._failing(path, f"appending {schema.table} to {path} at LSN {mark.lsn}"):
            open_table = self._table(path)
            table = open_table.table
            have = table_types(open_table, schema)
            if (
                have is None
                or have.names != [c.name for c in schema.columns]
                or not delta_rs_writes(table.protocol())
                or vector_writable(table, schema)  # its key index follows the vector path
            ):
                return None
            app_id, version = mark.txn
            done = open_table.done(app_id)
            if done is not None and done >= version:
                return WriteResult(schema.table, None)  # committed before: Delta's txn says so
            table = open_table.synced()
            if not keys_apart(table, schema.key[0], stage.bounds):
                return None
            written = 0
            if hand_appendable(table, nullable=True):
                written = append(
                    open_table.store, table.version(), stage.reader(have), have, mark
                ).size
                table = open_table.synced()
            else:
                deltalake.write_deltalake(
                    table,
                    stage.reader(have),
                    mode="append",
                    target_file_size=APPEND_FILE_BYTES,
                    commit_properties=marked(mark),
                    post_commithook_properties=no_checkpoint(),
                )
                table = open_table.synced()
            open_table.wrote(app_id, version)
            keep_log(table, open_table.store.location)
        return WriteResult(
            schema.table, table.version(), stage.rows, written_bytes=written, durable=written > 0
        )

    def merge_source(
        self,
        path: str,
        schema: TargetSchema,
        source: KeyedSource,
        mark: CommitMark,
        *,
        stamping: Stamping = Stamping.NONE,
        by_positions: bool = False,
    ) -> WriteResult | None:
        """A MERGE source (``apply.batching.source``, stamped as ``stamping`` says) merged by
        delta-rs into the table at ``path``; None: Spark's path, nothing written. With
        ``by_positions`` (a large source), a table without deletion vectors is first tried
        copy-on-write by its keys' positions (``vector_write``, ``copy_on_write``): delta-rs's
        MERGE of a million rows held 660 MB above its source, the positions' way holds the
        table's keys and the rows it writes."""

        if source.moved:
            return None
        with self._failing(path, f"writing {schema.table} to {path} at LSN {mark.lsn}"):
            open_table = self._table(path, confirm_later=True)
            written = self._merged(open_table, schema, source, mark, stamping, by_positions)
            # Each way took the answer to the log's check before it committed (its files
            # written meanwhile); one that committed nothing (Spark's way) takes it here.
            open_table.confirm_latest()
        return written  # None: Spark writes it; the open table reads that commit next time

    def _merged(
        self,
        open_table: OpenTable,
        schema: TargetSchema,
        source: KeyedSource,
        mark: CommitMark,
        stamping: Stamping,
        by_positions: bool,
    ) -> WriteResult | None:
        """``merge_source``'s ways, the first that writes the batch."""
        done = open_table.done(mark.txn[0])
        if not stamping.stamps and open_table.fact(
            ("vector_writable", schema.key), partial(vector_writable, schema=schema)
        ):
            return self._write_by_vectors(open_table, schema, source, mark, done)
        gained = None
        if not stamping.stamps and (done is None or done < mark.txn[1]):
            gained = vectors_pay(open_table, schema, source, self.features)
        if gained is not None:
            written = self._write_by_vectors(
                open_table, schema, source, mark, done, vectors_on=gained
            )
            if written is not None:
                warn_gained(schema.table, gained.gain)
            return written
        if by_positions and not stamping.stamps and self._positions_fit(open_table, schema):
            written = self._write_by_vectors(
                open_table, schema, source, mark, done, copy_on_write=True
            )
            if written is not None:
                return written
        return merge_into(
            open_table,
            schema,
            source,
            mark,
            done=done,
            max_bytes=self.max_bytes,
            stamping=stamping,
        )

    @contextmanager
    def _failing(self, path: str, what: str) -> Iterator[None]:
        """A delta-rs error while doing ``what`` as a ``TargetTableError`` naming it, a raced
        commit as itself; either way the table at ``path`` is read anew next time."""
        import deltalake

        try:
            yield
        except CommitRacedError:
            self.forget(path)
            raise
        except deltalake.exceptions.CommitFailedError as exc:  # delta-rs lost the same race
            self.forget(path)
            raise CommitRacedError(f"{what} through delta-rs: {exc}") from exc
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            self.forget(path)
            raise TargetTableError(f"{what} through delta-rs failed: {exc}") from exc

    def _write_by_vectors(
        self,
        open_table: OpenTable,
        schema: TargetSchema,
        source: KeyedSource,
        mark: CommitMark,
        done: int | None,
        *,
        copy_on_write: bool = False,
        vectors_on: VectorsOn | None = None,
    ) -> WriteResult | None:
        """A batch into a table with deletion vectors on (``apply.delta.writer.vector_write``),
        or turned on by its commit (``vectors_on``); with ``copy_on_write``, into one without
        them, its key index made for this batch alone (kept, it would hold 9 bytes a row of a
        table no later batch may need)."""
        if done is not None and done >= mark.txn[1]:
            return WriteResult(schema.table, None)  # committed before: Delta's txn says so
        try:
            state = self._vector_state(open_table, schema, kept=not copy_on_write)
            if state is None:
                return None
            return write_by_vectors(
                open_table,
                state,
                schema,
                source,
                mark,
                copy_on_write=copy_on_write,
                vectors_on=vectors_on,
            )
        except pa.ArrowException:  # a key type pyarrow cannot look up
            return None
        except (DeletionVectorError, UnreadableLogError) as exc:
            # Another writer's vector or checkpoint this path does not read: Spark writes
            # the batch (and every later one the same, until the log is one this reads).
            self.forget(open_table.store.location)
            log.warning(
                "table written by Spark: pgsub's own writer cannot read its log",
                table=schema.table,
                path=open_table.store.location,
                lsn=str(mark.lsn),
                error=str(exc),
            )
            return None

    def _positions_fit(self, open_table: OpenTable, schema: TargetSchema) -> bool:
        """Whether a batch may be written into the table copy-on-write by its keys' positions:
        what the vector path allows, pgsub's own commit may write, and no more Parquet than
        this path merges."""
        table = open_table.table
        return (
            vectors_allowed(table, schema)
            and hand_appendable(table)
            and fitting_size(open_table, schema, self.max_bytes) is not None
        )

    def _vector_state(
        self, open_table: OpenTable, schema: TargetSchema, *, kept: bool = True
    ) -> VectorTable | None:
        """What the vector path keeps of the table (made at its first batch, or anew for a new
        replica identity); None: its columns or key do not allow the path. Not ``kept``: made
        for one batch, and what was kept is dropped."""
        types = table_types(open_table, schema)
        keys = None if types is None else lookup_keys(types, schema.key)
        if keys is None:
            return None
        location = open_table.store.location
        if not kept:
            with self._lock:
                self._vectors.pop(location, None)
            return VectorTable(LiveFiles(open_table.store), KeyIndex(open_table.store, keys))
        with self._lock:
            state = self._vectors.get(location)
        if state is None or state.index.keys != keys:
            state = VectorTable(LiveFiles(open_table.store), KeyIndex(open_table.store, keys))
            with self._lock:
                self._vectors[location] = state
        return state

    def warm(
        self, path: str, schema: TargetSchema, table: deltalake.DeltaTable | None = None
    ) -> None:
        """Read the key index of a table the vector path will write (after its copy, before
        READY), so that its first batch does not wait for it: 2.8 s at 50M rows. ``table``:
        the table as its copy left it, kept open for that batch. Anything that fails here is
        left to that first batch."""
        import deltalake

        if table is not None:
            self._adopt(self._store_of(path), table)
        try:
            open_table = self._table(path)
            if not schema.key or not vector_writable(open_table.table, schema):
                return
            state = self._vector_state(open_table, schema)
            if state is not None:
                state.files.read(open_table.version)
                state.index.refresh(state.files.files)
        except (
            deltalake.exceptions.DeltaError,
            pa.ArrowException,
            OSError,
            DeletionVectorError,
            UnreadableLogError,
        ) as exc:
            self.forget(path)
            log.info("key index left to the first batch", path=path, error=str(exc))

    def opened(self, path: str) -> OpenTable:
        """The table at ``path``, kept open between batches and brought up to its latest
        commit (a versions table's lookup and MERGE, ``apply.delta.versions``)."""
        return self._table(path)

    def _table(self, path: str, *, confirm_later: bool = False) -> OpenTable:
        """The table at ``path``, brought up to its latest commit. ``confirm_later``: in an
        object store, a table kept open is returned at once, the question whether its log
        moved on sent (``OpenTable.ask_latest``) and answered before the commit that needs
        it (``OpenTable.confirm_latest``): the batch's files are written meanwhile, so that
        round trip is not one a batch waits for. On a local disk the answer costs no wait
        and is taken here."""
        import deltalake

        store = self._store_of(path)
        location = store.location
        with self._lock:
            open_table = self._open.get(location)
        if open_table is not None and confirm_later and not isinstance(store, LocalStore):
            open_table.ask_latest()
            return open_table
        if open_table is not None and open_table.latest():
            return open_table
        opened = deltalake.DeltaTable(location, storage_options=dict(store.options) or None)
        return self._adopt(store, opened)  # new, or deleted since

    def _adopt(self, store: TableStore, table: deltalake.DeltaTable) -> OpenTable:
        """``table`` kept open as the one at ``store``'s location, its vector state to be
        read anew."""
        open_table = OpenTable(store, table)
        with self._lock:
            self._open[store.location] = open_table
            self._vectors.pop(store.location, None)
        return open_table


def merge_locally(
    path: str, schema: TargetSchema, net: KeyedNet, mark: CommitMark
) -> WriteResult | None:
    """One batch through a fresh ``LocalMerges`` (a table opened for it alone)."""
    return LocalMerges().merge(path, schema, net, mark)
