"""Table states of a subscription (pg_subscription_rel.srsubstate) and their transitions.

Pure. ``TableState`` is PostgreSQL's lifecycle; ``stored`` says which states
are written to the state store (the others live in memory, as in
PostgreSQL). ``TableStatus.moved_to`` checks every transition against
``ALLOWED`` and raises ``IllegalTransitionError`` on anything else, so a bug
in the handoff cannot silently skip a step.

The LSN a status carries means one thing per state, and the state says
whether there is one (``TableStatus`` refuses a status without the LSN its
state needs, or with one where it has none); read it by its meaning:

- INIT, DATASYNC: none;
- FINISHEDCOPY: ``snapshot``, the copy's snapshot (its catch-up starts there);
- SYNCWAIT, CATCHUP: ``catchup_to``, the leader's position the catch-up must reach;
- SYNCDONE: ``synced_to``, the position the sync worker applied the table up to;
- READY: ``ready_at``, where the leader took the table over (none for a table
  added READY by ``pgsub refresh`` without a copy, as PostgreSQL leaves it).

The leader applies a table's changes (``applies``) when it is READY, or
SYNCDONE at or below the transaction's final LSN - everything up to that LSN
was applied by the sync worker.
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


# The states whose status must carry an LSN, and those that carry none (READY may or not).
WITH_LSN: Final = frozenset(
    {TableState.FINISHEDCOPY, TableState.SYNCWAIT, TableState.CATCHUP, TableState.SYNCDONE}
)
WITHOUT_LSN: Final = frozenset({TableState.INIT, TableState.DATASYNC})


class IllegalTransitionError(AssertionError):
    """A table state change that the protocol does not allow, or a status whose LSN does not
    fit its state: a bug."""


@dataclass(frozen=True, slots=True)
class TableStatus:
    """One table of a subscription: its state and the LSN that goes with it."""

    relid: int
    schema: str
    name: str
    state: TableState
    # As stored (pg_subscription_rel.srsublsn); read it by its meaning, below.
    lsn: Lsn | None = None

    def __post_init__(self) -> None:
        if self.lsn is None and self.state in WITH_LSN:
            raise IllegalTransitionError(
                f"table {self.qualified_name}: {self.state.name} needs an LSN"
            )
        if self.lsn is not None and self.state in WITHOUT_LSN:
            raise IllegalTransitionError(
                f"table {self.qualified_name}: {self.state.name} has no LSN (given {self.lsn})"
            )

    @property
    def qualified_name(self) -> str:
        return qualified_name(self.schema, self.name)

    @property
    def snapshot(self) -> Lsn:
        """FINISHEDCOPY: the copy's snapshot, where its catch-up starts."""
        return self._lsn_of(TableState.FINISHEDCOPY)

    @property
    def catchup_to(self) -> Lsn:
        """SYNCWAIT, CATCHUP: the leader's position that the sync worker's catch-up must reach."""
        return self._lsn_of(TableState.SYNCWAIT, TableState.CATCHUP)

    @property
    def synced_to(self) -> Lsn:
        """SYNCDONE: the position the sync worker applied the table up to."""
        return self._lsn_of(TableState.SYNCDONE)

    @property
    def ready_at(self) -> Lsn | None:
        """READY: where the leader took the table over (None: added READY without a copy)."""
        if self.state is not TableState.READY:
            raise IllegalTransitionError(
                f"table {self.qualified_name} is {self.state.name}, not READY"
            )
        return self.lsn

    def _lsn_of(self, *states: TableState) -> Lsn:
        if self.state not in states or self.lsn is None:
            raise IllegalTransitionError(
                f"table {self.qualified_name} is {self.state.name}, not "
                + " or ".join(s.name for s in states)
            )
        return self.lsn

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
        return self.state is TableState.SYNCDONE and self.synced_to <= final_lsn


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
