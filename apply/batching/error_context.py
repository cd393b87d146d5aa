"""Which remote transaction an apply error or a conflict concerns, in PostgreSQL's terms.

PostgreSQL's apply worker ends an error with a CONTEXT line naming the
subscription, the target relation and the remote transaction (its xid and
finish LSN, which ``ALTER SUBSCRIPTION ... SKIP`` takes; pgsub's is ``pgsub
skip``). ``TransactionError`` is that error; ``conflict_of`` turns a
writer's finding into a conflict of the remote transaction it came from.
"""

from __future__ import annotations

from apply.columns.columnar import binary_text
from apply.columns.schema import TargetSchema
from apply.columns.typemap import ColumnType
from apply.core.batch import Batch
from apply.core.errors import ApplyError
from apply.core.transactions import RemoteTransaction
from conflicts.findings import Finding
from conflicts.kinds import ConflictKind, Resolution
from conflicts.report import Conflict
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import BINARY, TEXT, UNCHANGED
from subscriber.replication.wire import pg_timestamp


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


def _text(value: bytes | None, kind: int, column_type: ColumnType) -> str | None:
    if kind == UNCHANGED:
        return "(unchanged)"
    if value is None:
        return None
    if kind == BINARY:
        return binary_text(value, column_type)
    return value.decode(errors="replace")


def conflict_of(
    finding: Finding,
    kind: ConflictKind,
    resolution: Resolution,
    schema: TargetSchema,
    batch: Batch,
) -> Conflict:
    """A finding of the writer with the remote transaction it came from."""
    tx = batch.transactions[finding.tx_index]
    image = finding.image
    remote = (
        None
        if image is None
        else {
            c.name: _text(v, k, c.type)
            for c, v, k in zip(schema.columns, image.values, image.kinds, strict=True)
        }
    )
    if schema.key:
        kinds = finding.key_kinds or bytes([TEXT]) * len(schema.key)
        key = {
            n: _text(v, k, schema.column(n).type)
            for n, v, k in zip(schema.key, finding.key, kinds, strict=True)
        }
    else:
        key = dict(remote or {})
    identity = key if kind not in (ConflictKind.INSERT_EXISTS,) else None
    return Conflict(
        kind=kind,
        relation=schema.table,
        resolution=resolution,
        key=key,
        existing=finding.existing,
        remote=None if kind is ConflictKind.DELETE_MISSING else remote,
        replica_identity=identity,
        xid=tx.xid,
        finish_lsn=tx.final_lsn,
        commit_time=pg_timestamp(tx.commit_time),
        origin=tx.origin,
        local_version=finding.local_version,
    )
