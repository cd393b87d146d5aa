"""Table states of a subscription (pg_subscription_rel.srsubstate) and their transitions.

Pure. ``TableState`` is PostgreSQL's lifecycle; ``stored`` says which states
are written to the state store (the others live in memory, as in
PostgreSQL). ``TableStatus.moved_to`` checks every transition against
``ALLOWED`` and raises ``IllegalTransitionError`` on anything else, so a bug
in the handoff cannot silently skip a step.

The leader applies a table's changes (``applies``) when it is READY, or
SYNCDONE with an LSN at or below the transaction's final LSN - everything
up to that LSN was applied by the sync worker.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Final

from subscriber.replication.lsn import Lsn
from subscriber.replication.names import qualified_name


class TableState(Enum):
    INIT = "i"
    DATASYNC = "d"
    FINISHEDCOPY = "f"
    SYNCWAIT = "w"
    CATCHUP = "c"
    SYNCDONE = "s"
    READY = "r"

    @property
    def stored(self) -> bool:
        return self not in (TableState.SYNCWAIT, TableState.CATCHUP)

    @property
    def label(self) -> str:
        return self.name.lower()


ALLOWED: Final[dict[TableState, frozenset[TableState]]] = {
    TableState.INIT: frozenset({TableState.DATASYNC, TableState.READY}),
    # A failed copy starts over from DATASYNC.
    TableState.DATASYNC: frozenset({TableState.DATASYNC, TableState.FINISHEDCOPY}),
    # DATASYNC again when the sync slot is gone (dropped by hand): copy again.
    TableState.FINISHEDCOPY: frozenset({TableState.SYNCWAIT, TableState.DATASYNC}),
    TableState.SYNCWAIT: frozenset({TableState.CATCHUP}),
    TableState.CATCHUP: frozenset({TableState.SYNCDONE}),
    TableState.SYNCDONE: frozenset({TableState.READY}),
    TableState.READY: frozenset(),
}


class IllegalTransitionError(AssertionError):
    """A table state change that the protocol does not allow: a bug."""


@dataclass(frozen=True, slots=True)
class TableStatus:
    """One table of a subscription: its state and the LSN that goes with it."""

    relid: int
    schema: str
    name: str
    state: TableState
    # What the LSN means depends on the state: INIT/DATASYNC none; FINISHEDCOPY the copy's
    # snapshot (its catch-up starts there); SYNCWAIT/CATCHUP the leader's position the
    # catch-up must reach; SYNCDONE/READY the position the table is applied up to.
    lsn: Lsn | None = None

    @property
    def qualified_name(self) -> str:
        return qualified_name(self.schema, self.name)

    def moved_to(self, state: TableState, lsn: Lsn | None = None) -> TableStatus:
        if state not in ALLOWED[self.state]:
            raise IllegalTransitionError(
                f"table {self.qualified_name}: {self.state.name} -> {state.name} is not allowed"
            )
        return replace(self, state=state, lsn=lsn)

    def applies(self, final_lsn: Lsn) -> bool:
        """Whether the leader applies this table's changes of a transaction at ``final_lsn``."""
        if self.state is TableState.READY:
            return True
        return self.state is TableState.SYNCDONE and self.lsn is not None and self.lsn <= final_lsn


@dataclass(frozen=True, slots=True)
class SyncFailure:
    """A table's failed sync attempts in a row, and the last one's error."""

    count: int
    error: str
    at: float  # unix time of the last failure
    retry_in: float  # seconds from ``at`` to the next attempt

    @staticmethod
    def fields(failure: SyncFailure | None) -> dict[str, object]:
        """A table's failures as ``/status`` shows them (None: none since its last success)."""
        if failure is None:
            return {"sync_failures": 0, "last_error": None, "last_error_at": None, "retry_at": None}
        return {
            "sync_failures": failure.count,
            "last_error": failure.error,
            "last_error_at": failure.at,
            "retry_at": failure.at + failure.retry_in,  # an attempt under way: sync_worker
        }
