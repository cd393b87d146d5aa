"""What ``ALTER SUBSCRIPTION`` changes at run time (enabled, the LSN to skip), and the publisher.

``pgsub skip``, ``pgsub enable`` and ``pgsub disable`` write to the state
store; ``SubscriptionSettings`` is the running daemon's view of it, re-read
every few seconds (``refresh``), as PostgreSQL's worker re-reads its
subscription. Thread-safe: the apply thread asks ``skip_lsn`` per
transaction, the supervisor asks ``enabled``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from subscriber.replication.errors import SubscriberError
from subscriber.replication.lsn import Lsn
from subscriber.replication.slot import PublisherIdentity

log = structlog.get_logger(__name__)

SKIP_LSN = "skip_lsn"
ENABLED = "enabled"
PUBLISHER_SYSTEM_ID = "publisher_system_id"
PUBLISHER_TIMELINE = "publisher_timeline"
CREATED = "created:"  # + a table's qualified name: its Delta table was created
# pg_subscription.subtwophasestate: "pending" until every table is READY, then "enabled".
TWO_PHASE = "two_phase"
REFRESH_INTERVAL = 3.0


class SettingsLog(Protocol):
    """``apply.delta.state_store.SettingsStore``."""

    def load(self, subscription: str) -> dict[str, str]: ...

    def record(self, subscription: str, key: str, value: str, *more: tuple[str, str]) -> None: ...


class SubscriptionSettings:
    def __init__(
        self,
        subscription: str,
        store: SettingsLog,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.subscription = subscription
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._values: dict[str, str] = {}
        self._read_at = float("-inf")

    def refresh(self, *, force: bool = False) -> None:
        if not force and self._clock() - self._read_at < REFRESH_INTERVAL:
            return
        values = self._store.load(self.subscription)
        with self._lock:
            self._values = values
            self._read_at = self._clock()

    @property
    def enabled(self) -> bool:
        with self._lock:
            return self._values.get(ENABLED, "true") == "true"

    @property
    def skip_lsn(self) -> Lsn | None:
        with self._lock:
            text = self._values.get(SKIP_LSN)
        return Lsn.parse(text) if text else None

    @property
    def publisher(self) -> PublisherIdentity | None:
        """The publisher recorded at the subscription's first start (None: not yet)."""
        with self._lock:
            system_id = self._values.get(PUBLISHER_SYSTEM_ID)
            timeline = self._values.get(PUBLISHER_TIMELINE, "0")
        return None if system_id is None else PublisherIdentity(system_id, int(timeline))

    def record_publisher(self, identity: PublisherIdentity) -> None:
        known = self.publisher
        if known == identity:
            return
        if known is None or known.system_id != identity.system_id:
            self._store.record(self.subscription, PUBLISHER_SYSTEM_ID, identity.system_id)
        self._store.record(self.subscription, PUBLISHER_TIMELINE, str(identity.timeline))
        with self._lock:
            self._values[PUBLISHER_SYSTEM_ID] = identity.system_id
            self._values[PUBLISHER_TIMELINE] = str(identity.timeline)
        if known is not None:
            log.info(
                "publisher timeline changed",
                subscription=self.subscription,
                timeline=identity.timeline,
                was=known.timeline,
            )

    def was_created(self, table: str) -> bool:
        """Whether this subscription created ``table``'s Delta table (it must not vanish)."""
        with self._lock:
            return self._values.get(CREATED + table) == "true"

    def record_created(self, *tables: str) -> None:
        """``tables``' Delta tables were created by this subscription (one write)."""
        keys = [CREATED + table for table in tables if not self.was_created(table)]
        if not keys:
            return
        self._store.record(self.subscription, keys[0], "true", *((k, "true") for k in keys[1:]))
        with self._lock:
            self._values.update(dict.fromkeys(keys, "true"))

    def set_enabled(self, enabled: bool) -> None:
        self._store.record(self.subscription, ENABLED, "true" if enabled else "false")
        with self._lock:
            self._values[ENABLED] = "true" if enabled else "false"

    @property
    def two_phase(self) -> str | None:
        with self._lock:
            return self._values.get(TWO_PHASE)

    def set_two_phase(self, state: str) -> None:
        self._store.record(self.subscription, TWO_PHASE, state)
        with self._lock:
            self._values[TWO_PHASE] = state

    def advance_two_phase(self, wanted: bool, all_ready: bool, slot: str) -> str:
        """The two-phase state for the next attempt, as PostgreSQL's: pending while a table
        is not READY (a table-sync worker cannot handle a prepared transaction), then
        enabled; off when not ``wanted``, which a slot already enabled cannot go back to."""
        state = self.two_phase
        if not wanted:
            if state == "enabled":
                # Its slot now decodes prepared transactions whatever START_REPLICATION asks.
                raise SubscriberError(
                    f"subscription {self.subscription!r} has two_phase enabled (its slot "
                    f"{slot!r} sends prepared transactions) and it cannot be turned "
                    "off: set two_phase: true again, or `pgsub drop` the subscription and "
                    "start it anew"
                )
            return "off"
        if state != "enabled" and all_ready:
            self.set_two_phase(state := "enabled")
            log.info("two_phase enabled", subscription=self.subscription)
        elif state is None:
            self.set_two_phase(state := "pending")
            log.info("two_phase pending until every table is ready", subscription=self.subscription)
        return state

    def clear_skip(self) -> None:
        self._store.record(self.subscription, SKIP_LSN, "")
        with self._lock:
            self._values.pop(SKIP_LSN, None)
