"""Applies one batch to its Delta tables (docs/architecture.md, the path of a change, 6-10).

For each table the batch touches: drop what the table already applied,
resolve the target schema from the latest Relation (creating or evolving
the Delta table when it changed), collapse to the net effect and write it
in one commit. Tables are written concurrently; the batch counts as applied
only when every table committed - the caller then records the checkpoint
and confirms the flush position upstream.

A batch usually comes split and collapsed as it formed (``apply.batching.forming``,
``forming``), its work done while the batch before was written; while its
own tables are written, the worker forms the next (``while_writing``). A
spooled transaction is applied whole by ``apply.worker.whole`` where it can be.

An error names the remote transaction it concerns when it is known (a
conflict), as PostgreSQL's CONTEXT line does; its finish LSN is what
``pgsub skip`` takes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

import apply.columns.binary
from apply.arrival.spool import SpooledTransaction
from apply.batching.collapse import KeyedNet, Net, collapse, is_keyed
from apply.batching.conflict_handling import ConflictHandling
from apply.batching.error_context import TransactionError
from apply.batching.forming import Commits, Formed, Forming, fold_taken
from apply.columns.schema import TargetSchema, target_schema
from apply.columns.typemap import TypeLookup, resolve
from apply.core.batch import Batch, TableFilter, TableWork
from apply.core.errors import ApplyError, ConflictError, TargetTableError, as_apply_error
from apply.core.failpoints import failpoint
from apply.core.records import (
    MESSAGES_TABLE,
    BatchResult,
    CommitMark,
    TableResult,
    Within,
    WriteResult,
    message_rows,
)
from apply.core.rendering import TextForms, in_text_form
from apply.core.transactions import Bounds, MessageChange, RemoteTransaction
from apply.history.changelog import change_rows
from apply.history.versions import findings
from apply.plans.tables import Tables
from apply.schema_changes.ddl import SchemaChange, renamed_work
from apply.schema_changes.schema_follower import SchemaFollower, guess_renames
from apply.worker.whole import WholeTransactions
from apply.worker.writes_ahead import (
    Ahead,
    Settling,
    TableWrite,
    TakenAhead,
    WhileWriting,
    meanwhile,
)
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Column, Relation

if TYPE_CHECKING:
    import pyarrow as pa

log = structlog.get_logger(__name__)


class BatchApplier:
    """Applies batches of one subscription to its Delta tables."""

    def __init__(
        self,
        subscription: str,
        tables: Tables,
        types: TypeLookup,
        *,
        applies: TableFilter | None = None,
        conflicts: ConflictHandling | None = None,
        staging: Path | None = None,
        text_forms: TextForms | None = None,
        messages: bool = True,
    ) -> None:
        self.subscription = subscription
        # Binary values of types pgsub has no reader for, as the publisher's text forms.
        self._text_forms = text_forms
        self._tables = tables
        self._types = types
        self._should_apply = None if applies is None else applies.should_apply
        self._conflicts = conflicts = conflicts or ConflictHandling()
        self._resolutions = dict(conflicts.resolutions)
        self._applied: dict[str, Lsn] = {}
        self._within: dict[str, Within | None] = {}
        self._schemas: dict[str, tuple[Relation, TargetSchema]] = {}
        self._followed: set[str] = set()  # tables whose schema change this batch followed
        self._ddl = SchemaFollower(subscription, tables, types, self._applies, self.applied_lsn)
        self._keeps_messages = messages  # messages: true (else only DDL ones arrive)
        self._pool = ThreadPoolExecutor(max_workers=tables.writers, thread_name_prefix="merge")
        # What ``should_apply`` answers from (None: it never changes its answers).
        self._table_states = None if applies is None else applies.states
        self.forming = Forming(self)  # the open batch, split and collapsed as it forms
        # A batch's writes that ended durable, their conflicts reported before it confirms.
        self._settling = Settling(tables, self.forming, self._report_written)
        self._whole = WholeTransactions(
            self,
            tables,
            conflicts,
            self._resolutions,
            staging=staging,
            renders_binary=text_forms is not None,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def applied_lsn(self, table: str) -> Lsn:
        if table not in self._applied:
            self._applied[table] = self._tables.applied_lsn(table)
            if self._applied[table]:
                log.info("table progress read", table=table, applied_lsn=str(self._applied[table]))
        return self._applied[table]

    def _read_progress(self, batch: Batch) -> None:
        """The applied LSN of each table of ``batch`` this applier applies and has not read
        yet, read at once on the pool: each is a read of the table's log (in an object store a
        few requests), and at the first batch after a start or an initial load, 200 tables
        read one after another held the batch for seconds. ``Batch.tables`` then asks again,
        in order, and finds them known (or reads again one it forgot: ``_applies``)."""
        names: set[str] = set()
        for relation, tx in batch.relations():
            name = relation.qualified_name
            if name in self._applied or name in names:
                continue
            try:
                if self._should_apply is None or self._should_apply(relation, tx):
                    names.add(name)
            except ApplyError:
                continue  # asked again, in order, by ``Batch.tables``: raised there
        if len(names) > 1:
            list(self._pool.map(self.applied_lsn, sorted(names)))

    def applied_through(self, table: str, end_lsn: Lsn) -> int:
        """How many first changes of the spooled transaction ending at ``end_lsn`` the table
        has committed (pieces applied before a crash)."""
        if table not in self._within:
            self._within[table] = self._tables.applied_within(table)
            if self._within[table] is not None:
                log.info("table progress read", table=table, within=str(self._within[table]))
        within = self._within[table]
        return within.through if within is not None and within.end_lsn == end_lsn else 0

    # -- what the forming batch asks (``apply.batching.forming.FormingView``) ------------------

    def known_applied_lsn(self, table: str) -> Lsn | None:
        return self._applied.get(table)

    def formable(self, relation: Relation) -> bool | None:
        known = self._schemas.get(relation.qualified_name)
        if known is None or known[0] != relation:
            return None
        if self._tables.appends_changes(known[1].table) or self._tables.keeps_versions(known[1]):
            return False
        return self._text_forms is None or all(map(self._reads_binary, relation.columns))

    def table_states(self) -> object:
        return None if self._table_states is None else self._table_states()

    def _applies(self, relation: Relation, tx: RemoteTransaction) -> bool:
        """``should_apply``; a table this applier does not apply forgets its cached progress.

        Someone else (a sync worker) writes it meanwhile: once it comes back to
        this applier, its progress is read again from the table itself.
        """
        if self._should_apply is None or self._should_apply(relation, tx):
            return True
        self._applied.pop(relation.qualified_name, None)
        self._within.pop(relation.qualified_name, None)
        return False

    applies = _applies  # what the forming batch asks, for each of its changes

    def _mark(self, batch: Batch, table: str) -> CommitMark:
        last = batch.transactions[-1]
        if not last.partial:
            return CommitMark(self.subscription, batch.end_lsn, batch.commit_time)
        # A piece that leaves its transaction open: the table stays at its LSN.
        within = Within(last.end_lsn, last.first + len(last.changes))
        return CommitMark(self.subscription, self.applied_lsn(table), batch.commit_time, within)

    def _schema(self, work: TableWork) -> TargetSchema:
        known = self._schemas.get(work.name)
        if known is not None and known[0] == work.relation:
            return known[1]
        schema = target_schema(work.relation, self._types, is_keyed(work.relation))
        self._tables.prepare(schema)
        self._schemas[work.name] = (work.relation, schema)
        if known is not None and work.name not in self._followed:
            guess_renames(work.name, known[0], work.relation)
        return schema

    def _net(self, work: TableWork) -> Net:
        """The net effect of ``work`` on its table."""
        return collapse(self._readable(work))

    def _readable(self, work: TableWork) -> TableWork:
        """``work`` with binary values pgsub cannot read in text (``binary: true``)."""
        if self._text_forms is not None:
            work = in_text_form(work, self._reads_binary, self._text_forms)
        return work

    def _reads_binary(self, column: Column) -> bool:
        return apply.columns.binary.readable(resolve(column.type_oid, column.typmod, self._types))

    def apply(
        self,
        batch: Batch,
        formed: Formed | None = None,
        while_writing: WhileWriting | None = None,
        ahead: Ahead | None = None,
    ) -> BatchResult:
        """Apply ``batch``; on error nothing is confirmed and the batch may be applied again.

        ``formed``: the batch's work as it formed (``apply.batching.forming``), else it is split and
        collapsed now. ``while_writing`` is called while the tables are written (the next
        batch forms meanwhile). ``ahead``: the writes of a formed batch take what has
        arrived for their tables meanwhile (unless ``ahead.takes`` is False) and what they
        made durable is confirmed as they end (``Ahead``).

        A transaction that changes a table's columns (``apply.schema_changes.ddl``) splits the
        batch: the
        transactions before it are applied first, then the change, then the rest.
        """
        # A batch formed ahead holds no logical decoding message (``Forming`` abandons one
        # that does): no schema change splits it, nothing of it goes to the messages table,
        # and its 100,000 transactions after a backlog are not looked through for either.
        plain = formed is not None
        at = 0 if plain else self._ddl.at(batch)
        if at > 0:
            first = self.apply(Batch(batch.transactions[:at]))
            rest = self.apply(Batch(batch.transactions[at:]))
            return BatchResult(rest.end_lsn, first.tables + rest.tables)
        followed = self._follow_schema_changes(batch)
        if formed is None or followed:
            formed = None
            self._read_progress(batch)
            work = batch.tables(self.applied_lsn, self._applies, self.applied_through)
        else:
            work = formed.works
        for name, change in followed.items():
            if name in work:  # images sent before the change, read under the new names
                work[name] = renamed_work(work[name], change)
        self._settling.begin()
        messages = None if plain else self._messages(batch)
        if while_writing is None or followed or messages is not None:
            ahead = None  # the messages table is written last: nothing is confirmed before
        with self._tables.written_together():
            writes = self._submit(batch, work, formed, ahead is not None and ahead.takes)
            if while_writing is not None:
                settle = (
                    None if ahead is None else partial(self._settling.settle, batch, writes, ahead)
                )
                meanwhile([write.future for write in writes], while_writing, settle)
            results = self._collect(batch, writes)
            if messages is not None:
                results.append(self._write_messages(batch, messages))
        took = sum(1 for write in writes if write.taken)
        return BatchResult(batch.end_lsn, tuple(results), formed=formed is not None, ahead=took)

    def _submit(
        self, batch: Batch, work: dict[str, TableWork], formed: Formed | None, ahead: bool
    ) -> list[TableWrite]:
        """Each table's write of ``batch``, started on the pool; ``ahead``: a keyed table's
        takes what has arrived for it as it starts (``_taking``)."""
        commits = Commits((), batch.transactions)  # made when a stamped table asks
        writes = []
        for name, table_work in work.items():
            mark = self._mark(batch, name)
            try:
                schema = self._schema(table_work)
                net: Net | None = None if formed is None else formed.nets.get(name)
                if ahead and net is None and self._plainly_written(name, schema):
                    net = self._net(table_work)
                write = self._writer(table_work, schema, batch, mark, commits, net)
                if write is None:
                    continue
            except Exception as exc:
                cause = as_apply_error(exc)
                raise TransactionError(cause, self.subscription, name, None, batch) from exc
            first = table_work.changes[0].tx if table_work.changes else 0
            taken: list[TakenAhead] = []
            if ahead and isinstance(net, KeyedNet) and mark.within is None:
                write = partial(self._taking, table_work.relation, schema, net, mark, batch, taken)
            future = self._pool.submit(copy_context().run, self._timed, write)
            writes.append(
                TableWrite(name, schema, mark, len(table_work.changes), future, first, taken)
            )
        return writes

    def _plainly_written(self, table: str, schema: TargetSchema) -> bool:
        """Whether the table's batch is written as its net effect (not its change rows)."""
        return not self._tables.appends_changes(table) and not self._tables.keeps_versions(schema)

    def _taking(
        self,
        relation: Relation,
        schema: TargetSchema,
        net: Net,
        mark: CommitMark,
        batch: Batch,
        taken: list[TakenAhead],
    ) -> WriteResult:
        """A keyed table's write of ``batch`` (on the pool) with the table's changes that have
        arrived for the next batch, taken as it starts: its commit brings the table to the
        forming batch's last transaction."""
        assert isinstance(net, KeyedNet)
        took = self.forming.take_table(relation.qualified_name, relation)
        if took is not None:
            fold_taken(net, took, len(batch.transactions))
            last = took.transactions[-1]
            mark = CommitMark(self.subscription, last.end_lsn, last.commit_time)
            taken.append(TakenAhead(took, mark, Batch([*batch.transactions, *took.transactions])))
        return self._tables.write(schema, net, mark, self._resolutions)

    def _collect(self, batch: Batch, writes: list[TableWrite]) -> list[TableResult]:
        """Each table's commit, once every write ended; the first failure is raised."""
        results = []
        failure: TransactionError | None = None
        for write in writes:
            name, schema = write.name, write.schema
            # A write that took the table's changes of the next batch: their transactions too.
            took = write.taken[0] if write.taken else None
            context = batch if took is None else took.batch
            mark = write.committed_mark
            try:
                written, seconds = write.future.result()
            except ConflictError as exc:
                self._conflicts.report(exc.findings, schema, context, stopping=exc.kind)
                tx = context.transactions[exc.tx_index]
                failure = failure or TransactionError(exc, self.subscription, name, tx, context)
                continue
            except Exception as exc:  # noqa: BLE001 - re-raised with its table and transactions
                cause = as_apply_error(exc)
                failure = failure or TransactionError(cause, self.subscription, name, None, context)
                continue
            if mark.within is None:
                self._applied[name] = mark.lsn
            self._within[name] = mark.within
            if not self._settling.reported(name):
                self._report_written(write, batch)
            changes = write.changes + (0 if took is None else len(took.taken.changes))
            results.append(TableResult(name, written, seconds, changes, mark))
        if failure is not None:
            raise failure
        return results

    def _report_written(self, write: TableWrite, batch: Batch) -> None:
        """The conflicts of a write that ended, named by its transactions (``batch``'s, and
        those its take saw)."""
        took = write.taken[0] if write.taken else None
        context = batch if took is None else took.batch
        self._conflicts.report(write.future.result()[0].conflicts, write.schema, context)

    def _writer(
        self,
        work: TableWork,
        schema: TargetSchema,
        batch: Batch,
        mark: CommitMark,
        commits: Sequence[tuple[int, int]],
        net: Net | None = None,
    ) -> Callable[[], WriteResult] | None:
        """The write of ``work`` to its table, kept as its history says; None: nothing to do.
        ``net``: its net effect, collapsed as the batch formed."""
        if self._tables.appends_changes(work.name):
            rows = change_rows(self._readable(work), schema, batch)
            return partial(self._tables.append_changes, schema, rows, mark)
        if self._tables.keeps_versions(schema):
            readable = self._readable(work)
            rows = change_rows(readable, schema, batch)
            witness = partial(findings, readable, schema)
            return partial(
                self._tables.write_versions, schema, rows, mark, self._resolutions, witness
            )
        if net is None:
            net = self._net(work)
        if _nothing_to_do(net):
            return None
        if isinstance(net, KeyedNet):
            net.commits = commits  # a stamped table stamps rows with them
        return partial(self._tables.write, schema, net, mark, self._resolutions)

    def _follow_schema_changes(self, batch: Batch) -> dict[str, SchemaChange]:
        """The schema changes of the batch's first transaction, made to the tables, by table
        (the last one of a table: its renames read the images before it)."""
        followed: dict[str, SchemaChange] = {}
        tx = batch.transactions[0] if batch.transactions else None
        for change in [] if tx is None else self._ddl.changes(tx):
            try:
                self._ddl.follow(change)
            except Exception as exc:
                cause = as_apply_error(exc)
                raise TransactionError(cause, self.subscription, change.table, tx, batch) from exc
            followed[change.table] = change
        self._followed = set(followed)
        return followed

    def _messages(self, batch: Batch) -> pa.Table | None:
        """The batch's logical decoding messages the messages table does not have yet."""
        if not self._keeps_messages:
            return None
        if not any(isinstance(c, MessageChange) for tx in batch.transactions for c in tx.changes):
            return None
        last = batch.transactions[-1]
        through = self.applied_through(MESSAGES_TABLE, last.end_lsn) if last.total else 0
        kept = batch.messages(self.applied_lsn(MESSAGES_TABLE), through)
        return message_rows(self.subscription, batch, kept) if kept else None

    def _write_messages(self, batch: Batch, rows: pa.Table) -> TableResult:
        started = time.monotonic()
        mark = self._mark(batch, MESSAGES_TABLE)  # a piece of a spooled one: how far it is
        try:
            write = self._tables.write_messages(rows, mark)
        except Exception as exc:
            cause = as_apply_error(exc)
            raise TransactionError(cause, self.subscription, None, None, batch) from exc
        if mark.within is None:
            self._applied[MESSAGES_TABLE] = batch.end_lsn
        self._within[MESSAGES_TABLE] = mark.within
        seconds = time.monotonic() - started
        return TableResult(MESSAGES_TABLE, write, seconds, rows.num_rows, mark)

    def verify(self, result: BatchResult) -> None:
        """Before ``result`` is confirmed: each commit it made is still in its table's log
        (``Tables.verify_commit``); one another engine replaced fails the batch, which is
        applied again on the table as it is now."""
        verified = self._settling.verified()
        for table in result.tables:
            if table.write.version is None or table.mark is None:
                continue
            if (table.table, table.write.version) in verified:  # read back by ``Settling``
                continue
            try:
                self._tables.verify_commit(table.table, table.write.version, table.mark)
            except TargetTableError:
                self._applied.pop(table.table, None)  # read from the table again
                self._within.pop(table.table, None)
                raise

    def apply_whole(
        self, tx: SpooledTransaction, bounds: Bounds, on_piece: Callable[[Counter[str]], None]
    ) -> BatchResult | None:
        """Apply a spooled transaction in one commit per table (``apply.worker.whole``); None when
        it cannot be (the caller applies it in pieces instead, as before).

        ``on_piece`` is told of each piece read (for the change counters).
        """
        return self._whole.apply(tx, bounds, on_piece)

    # -- what a whole transaction asks (``apply.worker.whole.WholeView``) ----------------------

    def schema_of(self, work: TableWork) -> TargetSchema:
        return self._schema(work)

    def net_of(self, work: TableWork) -> Net:
        return self._net(work)

    def committed(self, table: str, lsn: Lsn) -> None:
        self._applied[table] = lsn
        self._within[table] = None

    def _timed(self, write: Callable[[], WriteResult]) -> tuple[WriteResult, float]:
        started = time.monotonic()
        result = write()
        failpoint("apply.after_table_write")
        return result, time.monotonic() - started


def _nothing_to_do(net: Net) -> bool:
    return not net.truncated and not net.rows
