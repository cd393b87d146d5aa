"""A spooled transaction in one commit per table (docs/apply.md, "Large transactions").

A transaction that went to the spool (streamed, or larger than a batch) has
its pieces' net effects staged as Parquet (``apply.plans.staging``) - while it
arrived (``apply.arrival.prestage``), or read back from its spool at its commit -
and lands in one MERGE per table that reads them all. What the one-MERGE
path cannot take (a table without a key, a TRUNCATE, a key changed in two
pieces, a table resuming pieces applied before a restart) is left to the
pieces, as the worker applied every spooled transaction before
(``ApplyWorker._apply_spooled``).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

import structlog

from apply.arrival.spool import SpooledTransaction
from apply.batching.collapse import KeyedNet, Net
from apply.batching.columns_net import keyed_columns_source
from apply.batching.conflict_handling import ConflictHandling
from apply.batching.error_context import TransactionError
from apply.batching.resolve import looks_up_first, origin_looks_up_first
from apply.batching.source import KeyedSource, keyed_source
from apply.columns.change_columns import ChangeColumns
from apply.columns.schema import TargetSchema
from apply.core.batch import Batch, TableChange, TableWork
from apply.core.errors import ConflictError, as_apply_error
from apply.core.failpoints import failpoint
from apply.core.records import BatchResult, CommitMark, TableResult
from apply.core.transactions import Bounds, RemoteTransaction
from apply.plans.staging import StagedSource
from apply.plans.tables import Tables
from conflicts.kinds import ConflictKind, Resolution
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation

log = structlog.get_logger(__name__)

Stages = dict[str, StagedSource]  # per table


class WholeView(Protocol):
    """What the applier tells a whole transaction (``BatchApplier``)."""

    subscription: str

    def applies(self, relation: Relation, tx: RemoteTransaction) -> bool: ...

    def applied_lsn(self, table: str) -> Lsn: ...

    def applied_through(self, table: str, end_lsn: Lsn) -> int: ...

    def schema_of(self, work: TableWork) -> TargetSchema:
        """The table's target schema, made ready for ``work``'s columns."""
        ...

    def net_of(self, work: TableWork) -> Net: ...

    def committed(self, table: str, lsn: Lsn) -> None:
        """The table committed the transaction ending at ``lsn`` whole."""
        ...


class WholeTransactions:
    """Spooled transactions of one applier, each in one commit per table."""

    def __init__(
        self,
        view: WholeView,
        tables: Tables,
        conflicts: ConflictHandling,
        resolutions: Mapping[ConflictKind, Resolution],
        *,
        staging: Path | None,
        renders_binary: bool,
    ) -> None:
        self.subscription = view.subscription
        self._view = view
        self._tables = tables
        self._conflicts = conflicts
        self._resolutions = resolutions
        # Where the pieces are staged (None: never; the Spark executors must read this local
        # folder, so a local master only).
        self._staging = staging
        self._renders_binary = renders_binary  # binary values pgsub renders in text first

    def apply(
        self, tx: SpooledTransaction, bounds: Bounds, on_piece: Callable[[Counter[str]], None]
    ) -> BatchResult | None:
        """Apply ``tx`` in one commit per table; None when it cannot be (the caller applies
        it in pieces instead). ``on_piece`` is told of each piece read (the change counters).
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
        """The stages made while ``tx`` arrived (``apply.arrival.prestage``), when the commit finds
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
                schema = self._view.schema_of(TableWork(relation))
            except Exception as exc:
                cause = as_apply_error(exc)
                batch = Batch([tx.head])
                raise TransactionError(cause, self.subscription, name, tx.head, batch) from exc
            if schema != stage.schema or not self._stageable(tx, schema):
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
            for name, work in batch.tables(self._view.applied_lsn, self._view.applies).items():
                try:
                    schema = self._view.schema_of(work)
                    net = self._view.net_of(work)
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
                    schema = self._view.schema_of(TableWork(changes.relation))
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
        if not self._view.applies(relation, tx):
            return False
        return tx.end_lsn > self._view.applied_lsn(relation.qualified_name)

    def _columns_source(self, changes: ChangeColumns, schema: TargetSchema) -> KeyedSource | None:
        """The MERGE source of one table's changes held as columns: computed a column at a
        time where it can be (``apply.batching.columns_net``), else by the chain."""
        if not schema.key:
            return None
        readable = not self._renders_binary or not changes.has_binary
        source = keyed_columns_source(changes, schema) if readable else None
        if source is not None:
            return source
        changed = [TableChange(0, change) for change in changes.row_changes()]
        net = self._view.net_of(TableWork(changes.relation, changed))
        return None if not isinstance(net, KeyedNet) or net.truncated else keyed_source(net, schema)

    def _stage_of(
        self, stages: Stages, root: Path, tx: SpooledTransaction, schema: TargetSchema
    ) -> StagedSource | None:
        """Where ``schema``'s table stages the transaction; None when it cannot."""
        name = schema.table
        if name not in stages:
            if not self._stageable(tx, schema):
                return None
            stages[name] = StagedSource(root / f"{len(stages):04d}", schema)
        stage = stages[name]
        return stage if stage.schema == schema else None

    def _stageable(self, tx: SpooledTransaction, schema: TargetSchema) -> bool:
        """Whether ``schema``'s table can take ``tx`` in one commit: not when it resumes
        pieces applied before a crash, has no key (a multiset), or is kept otherwise than as
        a mirror (each piece is then a batch: its rows appended, or stamped)."""
        if self._view.applied_through(schema.table, tx.end_lsn) or not schema.key:
            return False
        return self._tables.plain_mirror(schema)

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
                    split = Batch([piece]).tables(self._view.applied_lsn, self._view.applies)
                    work = split.get(name)
                    if work is not None:
                        net = self._view.net_of(work)
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
            self._view.committed(name, tx.end_lsn)
            self._conflicts.report(write.conflicts, stage.schema, batch)
            seconds = time.monotonic() - started
            results.append(TableResult(name, write, seconds, stage.rows, mark))
        return BatchResult(tx.end_lsn, tuple(results))
