"""Applies one batch to its Delta tables: the leader's step 5-6 (DESIGN section 2).

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

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import structlog

from apply.batch import Batch, ShouldApply, TableWork
from apply.collapse import KeyedNet, Net, collapse, is_keyed
from apply.delta_writer import CommitMark, ConflictError, WriteResult
from apply.errors import ApplyError
from apply.merge_plan import OnExists
from apply.schema import Evolution, TargetSchema, target_schema
from apply.transactions import RemoteTransaction
from apply.typemap import TypeLookup
from subscriber.failpoints import failpoint
from subscriber.lsn import Lsn
from subscriber.messages import Relation

log = structlog.get_logger(__name__)


class Tables(Protocol):
    """The Delta side, as the applier needs it (``apply.delta_writer.DeltaTables``)."""

    def applied_lsn(self, table: str) -> Lsn: ...

    def prepare(self, schema: TargetSchema) -> Evolution | None: ...

    def write(
        self, schema: TargetSchema, net: Net, mark: CommitMark, on_exists: OnExists = ...
    ) -> WriteResult: ...


class TransactionError(ApplyError):
    """An apply error with the remote transaction it happened in."""

    def __init__(
        self,
        cause: ApplyError,
        subscription: str,
        table: str | None,
        tx: RemoteTransaction | None,
        batch: Batch,
    ) -> None:
        self.cause = cause
        self.table = table
        self.tx = tx
        self.batch = batch
        target = f' for replication target relation "{table}"' if table else ""
        if tx is not None:
            where = f"in transaction {tx.xid} finished at {tx.final_lsn}"
        elif len(batch.transactions) == 1:
            only = batch.transactions[0]
            where = f"in transaction {only.xid} finished at {only.final_lsn}"
        else:
            first, last = batch.transactions[0], batch.transactions[-1]
            where = (
                f"in the {len(batch.transactions)} transactions finished from "
                f"{first.final_lsn} to {last.final_lsn}"
            )
        super().__init__(
            f'{cause}\nCONTEXT: processing remote data for subscription "{subscription}"'
            f"{target} {where}"
        )

    @property
    def finish_lsn(self) -> Lsn | None:
        """The finish LSN of the one transaction the error is known to be in."""
        if self.tx is not None:
            return self.tx.final_lsn
        if len(self.batch.transactions) == 1:
            return self.batch.transactions[0].final_lsn
        return None


@dataclass(frozen=True, slots=True)
class TableResult:
    table: str
    write: WriteResult
    seconds: float
    changes: int


@dataclass(frozen=True, slots=True)
class BatchResult:
    end_lsn: Lsn
    tables: tuple[TableResult, ...]

    @property
    def versions(self) -> dict[str, int]:
        return {t.table: t.write.version for t in self.tables if t.write.version is not None}


class BatchApplier:
    """Applies batches of one subscription to its Delta tables."""

    def __init__(
        self,
        subscription: str,
        tables: Tables,
        types: TypeLookup,
        *,
        should_apply: ShouldApply | None = None,
        on_exists: OnExists = OnExists.ERROR,
        max_parallel: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.subscription = subscription
        self._tables = tables
        self._types = types
        self._should_apply = should_apply
        self._on_exists = on_exists
        self._clock = clock
        self._applied: dict[str, Lsn] = {}
        self._schemas: dict[str, tuple[Relation, TargetSchema]] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="merge")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def applied_lsn(self, table: str) -> Lsn:
        if table not in self._applied:
            self._applied[table] = self._tables.applied_lsn(table)
            if self._applied[table]:
                log.info("table progress read", table=table, applied_lsn=str(self._applied[table]))
        return self._applied[table]

    def _schema(self, work: TableWork) -> TargetSchema:
        known = self._schemas.get(work.name)
        if known is not None and known[0] == work.relation:
            return known[1]
        schema = target_schema(work.relation, self._types, is_keyed(work.relation))
        self._tables.prepare(schema)
        self._schemas[work.name] = (work.relation, schema)
        return schema

    def apply(self, batch: Batch) -> BatchResult:
        """Apply ``batch``; on error nothing is confirmed and the batch may be applied again."""
        work = batch.tables(self.applied_lsn, self._should_apply)
        mark = CommitMark(self.subscription, batch.end_lsn, batch.commit_time)
        jobs = []
        for name, table_work in work.items():
            try:
                schema = self._schema(table_work)
                net = collapse(table_work)
            except ApplyError as exc:
                raise TransactionError(exc, self.subscription, name, None, batch) from exc
            if _nothing_to_do(net):
                continue
            jobs.append(
                (name, len(table_work.changes), self._pool.submit(self._write, schema, net, mark))
            )
        results = []
        failure: TransactionError | None = None
        for name, changes, future in jobs:
            try:
                write, seconds = future.result()
            except ConflictError as exc:
                tx = batch.transactions[exc.tx_index]
                failure = failure or TransactionError(exc, self.subscription, name, tx, batch)
                continue
            except ApplyError as exc:
                failure = failure or TransactionError(exc, self.subscription, name, None, batch)
                continue
            self._applied[name] = batch.end_lsn
            results.append(TableResult(name, write, seconds, changes))
        if failure is not None:
            raise failure
        return BatchResult(batch.end_lsn, tuple(results))

    def _write(self, schema: TargetSchema, net: Net, mark: CommitMark) -> tuple[WriteResult, float]:
        started = self._clock()
        result = self._tables.write(schema, net, mark, self._on_exists)
        failpoint("apply.after_table_write")
        return result, self._clock() - started


def _nothing_to_do(net: Net) -> bool:
    if net.truncated:
        return False
    if isinstance(net, KeyedNet):
        return not net.rows
    return not net.rows
