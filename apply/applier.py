"""Applies one batch to its Delta tables (docs/architecture.md, the path of a change, 6-10).

For each table the batch touches: drop what the table already applied,
resolve the target schema from the latest Relation (creating or evolving
the Delta table when it changed), collapse to the net effect and write it
in one commit. Tables are written concurrently; the batch counts as applied
only when every table committed - the caller then records the checkpoint
and confirms the flush position upstream.

An error names the remote transaction it concerns when it is known (a
conflict), as PostgreSQL's CONTEXT line does; its finish LSN is what
``pgsub skip`` takes.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

import apply.binary
from apply.batch import Batch, ShouldApply, TableChange, TableWork
from apply.change_columns import ChangeColumns
from apply.changelog import change_rows
from apply.collapse import KeyedNet, Net, collapse, is_keyed
from apply.columns_net import keyed_columns_source
from apply.conflict_handling import ConflictHandling
from apply.ddl import SchemaChange, renamed_work
from apply.error_context import TransactionError
from apply.errors import ConflictError, as_apply_error
from apply.failpoints import failpoint
from apply.records import (
    MESSAGES_TABLE,
    BatchResult,
    CommitMark,
    TableResult,
    Within,
    WriteResult,
    message_rows,
)
from apply.rendering import TextForms, in_text_form
from apply.resolve import looks_up_first, origin_looks_up_first
from apply.schema import TargetSchema, target_schema
from apply.schema_follower import SchemaFollower, guess_renames
from apply.source import KeyedSource, keyed_source
from apply.spool import SpooledTransaction
from apply.staging import StagedSource
from apply.tables import Tables
from apply.transactions import Bounds, MessageChange, RemoteTransaction
from apply.typemap import TypeLookup, resolve
from apply.versions import findings
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Column, Relation

if TYPE_CHECKING:
    import pyarrow as pa

log = structlog.get_logger(__name__)

Stages = dict[str, StagedSource]  # per table

MERGE_THREADS = 4  # tables of a batch written at once


class BatchApplier:
    """Applies batches of one subscription to its Delta tables."""

    def __init__(
        self,
        subscription: str,
        tables: Tables,
        types: TypeLookup,
        *,
        should_apply: ShouldApply | None = None,
        conflicts: ConflictHandling | None = None,
        staging: Path | None = None,
        text_forms: TextForms | None = None,
        messages: bool = True,
    ) -> None:
        self.subscription = subscription
        # Binary values of types pgsub has no reader for, as the publisher's text forms.
        self._text_forms = text_forms
        # Where a large transaction's pieces are staged for one MERGE per table (None: never;
        # the Spark executors must read this local folder, so a local master only).
        self._staging = staging
        self._tables = tables
        self._types = types
        self._should_apply = should_apply
        self._conflicts = conflicts = conflicts or ConflictHandling()
        self._resolutions = dict(conflicts.resolutions)
        self._applied: dict[str, Lsn] = {}
        self._within: dict[str, Within | None] = {}
        self._schemas: dict[str, tuple[Relation, TargetSchema]] = {}
        self._followed: set[str] = set()  # tables whose schema change this batch followed
        self._ddl = SchemaFollower(subscription, tables, types, self._applies, self.applied_lsn)
        self._keeps_messages = messages  # messages: true (else only DDL ones arrive)
        self._pool = ThreadPoolExecutor(max_workers=MERGE_THREADS, thread_name_prefix="merge")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def applied_lsn(self, table: str) -> Lsn:
        if table not in self._applied:
            self._applied[table] = self._tables.applied_lsn(table)
            if self._applied[table]:
                log.info("table progress read", table=table, applied_lsn=str(self._applied[table]))
        return self._applied[table]

    def applied_through(self, table: str, end_lsn: Lsn) -> int:
        """How many first changes of the spooled transaction ending at ``end_lsn`` the table
        has committed (pieces applied before a crash)."""
        if table not in self._within:
            self._within[table] = self._tables.applied_within(table)
            if self._within[table] is not None:
                log.info("table progress read", table=table, within=str(self._within[table]))
        within = self._within[table]
        return within.through if within is not None and within.end_lsn == end_lsn else 0

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
        return apply.binary.readable(resolve(column.type_oid, column.typmod, self._types))

    def apply(self, batch: Batch) -> BatchResult:
        """Apply ``batch``; on error nothing is confirmed and the batch may be applied again.

        A transaction that changes a table's columns (``apply.ddl``) splits the batch: the
        transactions before it are applied first, then the change, then the rest.
        """
        at = self._ddl.at(batch)
        if at > 0:
            first = self.apply(Batch(batch.transactions[:at]))
            rest = self.apply(Batch(batch.transactions[at:]))
            return BatchResult(rest.end_lsn, first.tables + rest.tables)
        followed = self._follow_schema_changes(batch)
        work = batch.tables(self.applied_lsn, self._applies, self.applied_through)
        for name, change in followed.items():
            if name in work:  # images sent before the change, read under the new names
                work[name] = renamed_work(work[name], change)
        commits = tuple((int(tx.end_lsn), tx.commit_time) for tx in batch.transactions)
        jobs = []
        for name, table_work in work.items():
            mark = self._mark(batch, name)
            try:
                schema = self._schema(table_work)
                write = self._writer(table_work, schema, batch, mark, commits)
                if write is None:
                    continue
            except Exception as exc:
                cause = as_apply_error(exc)
                raise TransactionError(cause, self.subscription, name, None, batch) from exc
            changes = len(table_work.changes)
            jobs.append((name, schema, mark, changes, self._pool.submit(self._timed, write)))
        results = []
        failure: TransactionError | None = None
        messages = self._messages(batch)
        for name, schema, mark, changes, future in jobs:
            try:
                written, seconds = future.result()
            except ConflictError as exc:
                self._conflicts.report(exc.findings, schema, batch, stopping=exc.kind)
                tx = batch.transactions[exc.tx_index]
                failure = failure or TransactionError(exc, self.subscription, name, tx, batch)
                continue
            except Exception as exc:  # noqa: BLE001 - re-raised with its table and transactions
                cause = as_apply_error(exc)
                failure = failure or TransactionError(cause, self.subscription, name, None, batch)
                continue
            if mark.within is None:
                self._applied[name] = batch.end_lsn
            self._within[name] = mark.within
            self._conflicts.report(written.conflicts, schema, batch)
            results.append(TableResult(name, written, seconds, changes))
        if failure is not None:
            raise failure
        if messages is not None:
            results.append(self._write_messages(batch, messages))
        return BatchResult(batch.end_lsn, tuple(results))

    def _writer(
        self,
        work: TableWork,
        schema: TargetSchema,
        batch: Batch,
        mark: CommitMark,
        commits: tuple[tuple[int, int], ...],
    ) -> Callable[[], WriteResult] | None:
        """The write of ``work`` to its table, kept as its history says; None: nothing to do."""
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
        return TableResult(MESSAGES_TABLE, write, time.monotonic() - started, rows.num_rows)

    def apply_whole(
        self, tx: SpooledTransaction, bounds: Bounds, on_piece: Callable[[Counter[str]], None]
    ) -> BatchResult | None:
        """Apply a spooled transaction in one commit per table (``apply.staging``); None when
        it cannot be (the caller applies it in pieces instead, as before).

        ``on_piece`` is told of each piece read (for the change counters).
        """
        if self._staging is None or looks_up_first(self._resolutions):
            return None
        if origin_looks_up_first(self._resolutions):
            return None
        root = self._staging / f"tx-{tx.xid}-{tx.end_lsn}"
        shutil.rmtree(root, ignore_errors=True)
        try:
            started = time.monotonic()
            stages = self._prestaged(tx, on_piece)
            arriving = stages is not None
            if stages is None:
                stages = self._stage(tx, bounds, root, on_piece)
            if stages is None or not all(map(self._keys_unique, stages.values())):
                log.info(
                    "transaction applied in pieces",
                    subscription=self.subscription,
                    xid=tx.xid,
                    changes=tx.change_count,
                    why="a table without a key, a truncate, a key changed in two pieces, or a "
                    "table resuming pieces applied before a restart",
                )
                return None
            log.info(
                "transaction staged",
                subscription=self.subscription,
                xid=tx.xid,
                changes=tx.change_count,
                tables=len(stages),
                seconds=round(time.monotonic() - started, 3),
                while_arriving=arriving,
            )
            return self._write_stages(tx, bounds, stages)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def _prestaged(
        self, tx: SpooledTransaction, on_piece: Callable[[Counter[str]], None]
    ) -> Stages | None:
        """The stages made while ``tx`` arrived (``apply.prestage``), when the commit finds
        them right: what ``_stage`` checks of each table, checked once. None: staged now."""
        prestaged = tx.prestage.result() if tx.prestage is not None else None
        if prestaged is None or prestaged.changes != tx.change_count:
            return None
        stages: Stages = {}
        for name, stage in prestaged.stages.items():
            relation = prestaged.relations[name]
            if not self._applies_in(relation, tx.head):
                continue  # not the leader's now: as ``_stage`` leaves it out
            try:
                schema = self._schema(TableWork(relation))
            except Exception as exc:
                cause = as_apply_error(exc)
                batch = Batch([tx.head])
                raise TransactionError(cause, self.subscription, name, tx.head, batch) from exc
            if (
                schema != stage.schema
                or self.applied_through(name, tx.end_lsn)
                or not self._tables.plain_mirror(schema)
            ):
                log.info(
                    "transaction staged at its commit",
                    subscription=self.subscription,
                    xid=tx.xid,
                    table=name,
                    why="the table's schema or layout, or a restart part way through it",
                )
                return None
            stages[name] = stage
        on_piece(prestaged.operations)
        return stages

    def _stage(
        self,
        tx: SpooledTransaction,
        bounds: Bounds,
        root: Path,
        on_piece: Callable[[Counter[str]], None],
    ) -> Stages | None:
        stages: Stages = {}
        for piece in tx.frames(bounds):
            on_piece(piece.operations())
            if piece.has_messages:
                return None  # the messages table follows the pieces' marks
            columns, rows = piece.split()
            batch = Batch([rows])
            for name, work in batch.tables(self.applied_lsn, self._applies).items():
                try:
                    schema = self._schema(work)
                    net = self._net(work)
                except Exception as exc:
                    cause = as_apply_error(exc)
                    raise TransactionError(cause, self.subscription, name, tx.head, batch) from exc
                stage = self._stage_of(stages, root, tx, schema)
                if stage is None or not isinstance(net, KeyedNet) or not stage.add(net):
                    return None
            for name, changes in columns.items():
                if not self._applies_in(changes.relation, tx.head):
                    continue
                try:
                    schema = self._schema(TableWork(changes.relation))
                    source = self._columns_source(changes, schema)
                except Exception as exc:
                    cause = as_apply_error(exc)
                    raise TransactionError(cause, self.subscription, name, tx.head, batch) from exc
                stage = self._stage_of(stages, root, tx, schema)
                if stage is None or source is None or not stage.add_source(source):
                    return None
        return stages

    def _keys_unique(self, stage: StagedSource) -> bool:
        """Whether no key has rows in two of ``stage``'s pieces (then one MERGE takes them)."""
        if stage.pieces < 2:
            return True
        held = stage.keys_unique()
        return self._tables.staged_keys_unique(stage) if held is None else held

    def _applies_in(self, relation: Relation, tx: RemoteTransaction) -> bool:
        """Whether ``tx``'s changes of ``relation`` are the leader's to apply now (as
        ``Batch.tables`` keeps them)."""
        if self._applies is not None and not self._applies(relation, tx):
            return False
        return tx.end_lsn > self.applied_lsn(relation.qualified_name)

    def _columns_source(self, changes: ChangeColumns, schema: TargetSchema) -> KeyedSource | None:
        """The MERGE source of one table's changes held as columns: computed a column at a
        time where it can be (``apply.columns_net``), else by the chain."""
        if not schema.key:
            return None
        readable = self._text_forms is None or not changes.has_binary
        source = keyed_columns_source(changes, schema) if readable else None
        if source is not None:
            return source
        changed = [TableChange(0, change) for change in changes.row_changes()]
        net = self._net(TableWork(changes.relation, changed))
        return None if not isinstance(net, KeyedNet) or net.truncated else keyed_source(net, schema)

    def _stage_of(
        self, stages: Stages, root: Path, tx: SpooledTransaction, schema: TargetSchema
    ) -> StagedSource | None:
        """Where ``schema``'s table stages the transaction; None when it cannot."""
        name = schema.table
        if name not in stages:
            if self.applied_through(name, tx.end_lsn) or not schema.key:
                return None  # resumes pieces applied before a crash; or a multiset
            if not self._tables.plain_mirror(schema):
                return None  # each piece is a batch: its rows appended, or stamped
            stages[name] = StagedSource(root / f"{len(stages):04d}", schema)
        stage = stages[name]
        return stage if stage.schema == schema else None

    def _write_stages(
        self,
        tx: SpooledTransaction,
        bounds: Bounds,
        stages: dict[str, StagedSource],
    ) -> BatchResult:
        mark = CommitMark(self.subscription, tx.end_lsn, tx.commit_time)
        batch = Batch([tx.head])
        results = []
        resolutions = self._resolutions
        for name, stage in stages.items():

            def nets(name: str = name) -> Iterator[KeyedNet]:
                for piece in tx.pieces(bounds):
                    work = Batch([piece]).tables(self.applied_lsn, self._applies).get(name)
                    if work is not None:
                        net = self._net(work)
                        assert isinstance(net, KeyedNet)
                        yield net

            started = time.monotonic()
            try:
                write = self._tables.write_staged(stage.schema, stage, mark, resolutions, nets)
            except ConflictError as exc:
                self._conflicts.report(exc.findings, stage.schema, batch, stopping=exc.kind)
                raise TransactionError(exc, self.subscription, name, tx.head, batch) from exc
            except Exception as exc:
                cause = as_apply_error(exc)
                raise TransactionError(cause, self.subscription, name, tx.head, batch) from exc
            failpoint("apply.after_table_write")
            self._applied[name] = tx.end_lsn
            self._within[name] = None
            self._conflicts.report(write.conflicts, stage.schema, batch)
            results.append(TableResult(name, write, time.monotonic() - started, stage.rows))
        return BatchResult(tx.end_lsn, tuple(results))

    def _timed(self, write: Callable[[], WriteResult]) -> tuple[WriteResult, float]:
        started = time.monotonic()
        result = write()
        failpoint("apply.after_table_write")
        return result, time.monotonic() - started


def _nothing_to_do(net: Net) -> bool:
    return not net.truncated and not net.rows
