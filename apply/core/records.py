"""What pgsub records durably, as values: a commit's mark, a write's result, a table's state.

Pure. A commit of pgsub carries, in Delta's ``userMetadata``, the
subscription and the LSN the commit brings the table to (``CommitMark``);
a restart reads the LSN back (``lsn_from_metadata``), and the origin
tracker tells pgsub's commits from other writers' by it
(``apply.delta.spark.origins``). ``StoredTableState`` is a row of the state
store's ``table_states`` (PostgreSQL's pg_subscription_rel).
``message_rows`` are a batch's logical decoding messages as rows of the
messages table. ``BatchResult`` is what a batch's commits made (the
checkpoint row records its versions).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Final

from conflicts.findings import Finding
from subscriber.replication.lsn import Lsn
from subscriber.replication.wire import pg_timestamp

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow as pa

    from apply.core.batch import Batch
    from apply.core.transactions import MessageChange


@dataclass(frozen=True, slots=True)
class Within:
    """How far into the transaction ending at ``end_lsn`` a table has applied."""

    end_lsn: Lsn
    through: int  # the transaction's first ``through`` changes


@dataclass(frozen=True, slots=True)
class CommitMark:
    """What a write records about itself in the table's history.

    A piece of a spooled transaction that is not its last brings the table
    to no new LSN: ``lsn`` stays the table's applied LSN and ``within`` says
    how far into the open transaction the table is.
    """

    subscription: str
    lsn: Lsn
    commit_time: int  # microseconds since the PostgreSQL epoch
    within: Within | None = None

    def user_metadata(self) -> str:
        mark: dict[str, object] = {"subscription": self.subscription, "lsn": str(self.lsn)}
        if self.within is not None:
            mark["within"] = {"end_lsn": str(self.within.end_lsn), "through": self.within.through}
        return json.dumps({"pgsub": mark}, separators=(",", ":"))

    @property
    def txn(self) -> tuple[str, int]:
        """Delta's idempotent-write pair: an application id and a version that only grows.

        A piece counts in its own transaction's id, so that its version (how far
        into the transaction) does not depend on how the transaction was cut.
        """
        if self.within is None:
            return f"pgsub/{self.subscription}", int(self.lsn)
        return f"pgsub/{self.subscription}/{self.within.end_lsn}", self.within.through


@dataclass(frozen=True, slots=True)
class WriteResult:
    table: str
    version: int | None  # the Delta version committed; None when nothing was written
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    conflicts: tuple[Finding, ...] = ()
    written_bytes: int = 0  # what the commit wrote: data and vector files, the commit itself
    durable: bool = False  # made durable as it was committed (pgsub's own commits)
    changed_bytes: int = 0  # the bytes of the rows the batch changed, as the publisher sent them


def lsn_from_metadata(text: str | None, subscription: str) -> Lsn | None:
    """The LSN a commit of ``subscription`` brought the table to (None: not such a commit)."""
    mark = read_mark(text)
    if mark.get("subscription") != subscription:
        return None
    try:
        return Lsn.parse(str(mark["lsn"]))
    except (ValueError, KeyError):
        return None


def within_from_metadata(text: str | None, subscription: str) -> Within | None:
    """How far into an open transaction a commit of ``subscription`` brought the table."""
    mark = read_mark(text)
    within = mark.get("within")
    if mark.get("subscription") != subscription or not isinstance(within, dict):
        return None
    try:
        return Within(Lsn.parse(str(within["end_lsn"])), int(within["through"]))
    except (ValueError, KeyError, TypeError):
        return None


def read_mark(user_metadata: str | None) -> dict[str, object]:
    """The ``pgsub`` mark in a commit's ``userMetadata`` (empty when there is none)."""
    if not user_metadata:
        return {}
    try:
        mark = json.loads(user_metadata).get("pgsub", {})
    except (ValueError, AttributeError):
        return {}
    return mark if isinstance(mark, dict) else {}


# The messages table (``messages: true``) among the target tables: a name no PostgreSQL
# table's qualified name can be (those are quoted where they hold a colon).
MESSAGES_TABLE: Final = "pgsub:messages"


@dataclass(frozen=True, slots=True)
class StoredTableState:
    relid: int
    schema: str
    name: str
    state: str  # pg_subscription_rel.srsubstate letter; "" when the table left the subscription
    lsn: Lsn | None
    # When the row was recorded (as loaded; None when being recorded): tells a newer row of
    # another process (``pgsub resync``) from an older one of this process read back late.
    recorded_at: datetime | None = field(default=None, compare=False)


def message_rows(
    subscription: str, batch: Batch, messages: Sequence[tuple[int, MessageChange]]
) -> pa.Table:
    """Logical decoding messages as rows of the messages table, in order."""
    import pyarrow as pa

    def text(content: bytes) -> str | None:
        try:
            return content.decode("utf-8")
        except UnicodeDecodeError:
            return None

    txs = [batch.transactions[index] for index, _ in messages]
    changes = [change for _, change in messages]
    return pa.table(
        {
            "subscription": pa.array([subscription] * len(changes), pa.string()),
            "lsn": pa.array([int(m.lsn) for m in changes], pa.int64()),
            "lsn_text": pa.array([str(m.lsn) for m in changes], pa.string()),
            "transactional": pa.array([m.transactional for m in changes], pa.bool_()),
            "xid": pa.array(
                [tx.xid if m.transactional else None for tx, m in zip(txs, changes, strict=True)],
                pa.int64(),
            ),
            "end_lsn": pa.array([str(tx.end_lsn) for tx in txs], pa.string()),
            "commit_time": pa.array(
                [pg_timestamp(tx.commit_time) for tx in txs], pa.timestamp("us", tz="UTC")
            ),
            "prefix": pa.array([m.prefix for m in changes], pa.string()),
            "content": pa.array([m.content for m in changes], pa.binary()),
            "content_text": pa.array([text(m.content) for m in changes], pa.string()),
        }
    )


@dataclass(frozen=True, slots=True)
class TableResult:
    """One table's commit of a batch: what it wrote, in how long, for how many changes."""

    table: str
    write: WriteResult
    seconds: float
    changes: int
    mark: CommitMark | None = None  # what the commit carries (checked before confirming)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A batch applied: its end LSN and each table's commit (the checkpoint's versions)."""

    end_lsn: Lsn
    tables: tuple[TableResult, ...]
    formed: bool = False  # split and collapsed as it formed (``apply.batching.forming``)
    # The tables whose commit took changes of the next batch (``apply.worker.writes_ahead.Ahead``):
    # their versions hold transactions past ``end_lsn``, so no checkpoint row is recorded at it.
    ahead: int = 0

    @property
    def versions(self) -> dict[str, int]:
        return {t.table: t.write.version for t in self.tables if t.write.version is not None}


class TableWrites:
    """What each table's batches wrote since the process started, beside the bytes of the
    rows they changed: ``/status`` shows both, so write amplification shows per table.
    Added to by the apply worker's thread, read by the status sampler's."""

    def __init__(self) -> None:
        self._totals: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def add(self, table: str, written: int, changed: int) -> None:
        with self._lock:
            before = self._totals.get(table, (0, 0))
            self._totals[table] = (before[0] + written, before[1] + changed)

    def totals(self) -> dict[str, tuple[int, int]]:
        """Each table's (bytes written, bytes of rows changed)."""
        with self._lock:
            return dict(self._totals)
