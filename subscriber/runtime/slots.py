"""A subscription's slots on the publisher: its own, and the table-sync workers'.

``SlotWatch`` reads what the subscription's slot makes the publisher keep
(retained WAL, ``wal_status``, ``safe_wal_size``) into the metrics and
``/status``, every ``SLOT_WATCH_INTERVAL`` seconds whether pgsub streams or
not: a slot whose confirmed position does not move fills the publisher's disk.

Its own slot is checked at every start (the publisher is the one recorded,
the slot is pgoutput's) and created only on the first start
(``subscriber.replication.slot.plan_slot``). Sync slots are dropped when
their table no longer needs one: by the coordinator when a table leaves or
is copied again, and at start for tables a crash left past their copy.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import psycopg
import structlog

from subscriber.metrics import Metrics
from subscriber.replication import session
from subscriber.replication.catalog import PublisherCatalog
from subscriber.replication.commands import SnapshotAction, quote_literal
from subscriber.replication.errors import ReplicationError, SubscriberError
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.slot import PublisherIdentity, SlotAction, check_publisher, plan_slot
from subscriber.replication.stream import ReplicationConnection
from subscriber.runtime.config import SubscriptionConfig
from subscriber.runtime.settings import SubscriptionSettings
from subscriber.runtime.subscription_status import SubscriptionStatus
from tablesync.worker import is_sync_slot, sync_slot_name, sync_slot_relid

log = structlog.get_logger(__name__)

# How often the slot's retained WAL is read from the publisher (pg_replication_slots).
SLOT_WATCH_INTERVAL = 15.0
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")

_SLOT_EXISTS = "SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = "


class SlotInvalidatedError(ReplicationError):
    """The publisher invalidated the subscription's slot: it can never stream from it again."""

    def __init__(self, subscription: str, slot: str, confirmed: Lsn) -> None:
        super().__init__(
            f"the publisher invalidated slot {slot!r} of subscription {subscription!r} "
            "(wal_status lost: it removed WAL the slot still needed, when the slot held more "
            "than max_slot_wal_keep_size or stayed idle past idle_replication_slot_timeout); "
            f"the changes after {confirmed} are gone from the publisher, so the subscription "
            "cannot go on from its position. The way out is a copy of every table: `pgsub drop "
            f"-c <config> {subscription}` drops the slot and the subscription's state (its "
            "Delta tables stay), and the next start makes a new slot and copies every table "
            "again (copy_data: true)"
        )


@dataclass
class ExportedSnapshot:
    """The snapshot of a slot made with ``SNAPSHOT 'export'``: importable by other sessions
    (``SET TRANSACTION SNAPSHOT``) while the connection that made it stays idle and open."""

    connection: ReplicationConnection = field(repr=False)
    name: str
    lsn: Lsn  # the slot's consistent point: the snapshot sees every commit before it

    def close(self) -> None:
        self.connection.close()


class SubscriptionSlots:
    def __init__(
        self, config: SubscriptionConfig, conninfo: str, settings: SubscriptionSettings
    ) -> None:
        self.name = config.name
        self._config = config
        self._conninfo = conninfo
        self._settings = settings
        self.system_id = ""  # the publisher's, known once ``ensure`` ran
        # Where the publisher streams the slot from, known once ``ensure`` ran: the slot's
        # confirmed_flush_lsn, or a slot made now, its consistent point.
        self.confirmed = ZERO

    def ensure(self, flushed: Lsn, *, export_snapshot: bool = False) -> ExportedSnapshot | None:
        """Check the publisher and the slot; create the slot only on the first start.

        With ``export_snapshot``, a slot made now is made with ``SNAPSHOT 'export'`` and its
        snapshot returned, alive until it is closed (``tablesync.initial_load``)."""
        slot = self._config.slot
        connection = ReplicationConnection(self._conninfo)
        exported: ExportedSnapshot | None = None
        try:
            system = connection.identify_system()
            found = PublisherIdentity(system.system_id, system.timeline)
            recorded = self._settings.publisher
            check_publisher(self.name, recorded, found)
            self.system_id = system.system_id
            rows = connection.execute(
                "SELECT plugin, wal_status, confirmed_flush_lsn"
                " FROM pg_catalog.pg_replication_slots"
                " WHERE slot_name = " + quote_literal(slot)
            )
            if rows and rows[0]["wal_status"] == "lost":
                raise SlotInvalidatedError(self.name, slot, flushed)
            self.confirmed = Lsn.parse(rows[0]["confirmed_flush_lsn"] or "0/0") if rows else ZERO
            action = plan_slot(
                subscription=self.name,
                slot=slot,
                exists=bool(rows),
                plugin=rows[0]["plugin"] if rows else None,
                first_start=recorded is None and flushed == ZERO,
                create_slot=self._config.create_slot,
                confirmed=flushed,
            )
            if action is SlotAction.CREATE:
                # Two-phase is switched on at START_REPLICATION once every table is READY
                # (the walsender marks the slot then), as PostgreSQL's subscriber does.
                made = connection.create_slot(
                    slot,
                    failover=self._config.failover,
                    snapshot=SnapshotAction.EXPORT if export_snapshot else SnapshotAction.NOTHING,
                )
                self.confirmed = made.consistent_point
                if export_snapshot and made.snapshot_name:
                    exported = ExportedSnapshot(
                        connection, made.snapshot_name, made.consistent_point
                    )
        finally:
            if exported is None:
                connection.close()
        # Recorded once the slot exists: a crash in between leaves a first start.
        self._settings.record_publisher(found)
        return exported

    def drop_sync_slot(self, relid: int) -> None:
        slot = sync_slot_name(self.name, relid, self.system_id)
        with ReplicationConnection(self._conninfo) as connection:
            if connection.execute(_SLOT_EXISTS + quote_literal(slot)):
                connection.drop_slot(slot)

    def drop_leftover_sync_slots(self, copying: set[int]) -> None:
        """Sync slots of tables not in ``copying``: a crash after SYNCDONE left them holding
        WAL."""
        with ReplicationConnection(self._conninfo) as connection:
            rows = connection.execute(
                "SELECT slot_name FROM pg_catalog.pg_replication_slots"
                " WHERE database = current_database() AND NOT active"
            )
            for row in rows:
                slot = str(row["slot_name"])
                if is_sync_slot(self.name, slot) and sync_slot_relid(slot) not in copying:
                    connection.drop_slot(slot)
                    log.info("leftover sync slot dropped", subscription=self.name, slot=slot)


class SlotWatch:
    """The slot's retained WAL, status and safe size, into the metrics and ``/status``."""

    def __init__(
        self,
        config: SubscriptionConfig,
        catalog: PublisherCatalog,
        metrics: Metrics,
        status: SubscriptionStatus,
        *,
        interval: float | None = None,
    ) -> None:
        self.name = config.name
        self._slot = config.slot
        self._catalog = catalog
        self._metrics = metrics
        self._status = status
        self._interval = SLOT_WATCH_INTERVAL if interval is None else interval
        self._sampled_at = -self._interval

    def sample(self) -> None:
        """Read the slot, at most once per interval; a failed read is logged, never raised
        (the supervisor's own connections report a lost publisher)."""
        now = time.monotonic()
        if now - self._sampled_at < self._interval:
            return
        self._sampled_at = now
        try:
            wal = self._catalog.slot_wal(self._slot)
        except (SubscriberError, psycopg.Error) as exc:
            log.warning("slot not read", subscription=self.name, error=str(exc))
            return
        name, metrics, status = self.name, self._metrics, self._status
        status.slot_retained_wal_bytes = None if wal is None else wal.retained_bytes
        status.slot_wal_status = None if wal is None else wal.wal_status
        status.slot_safe_wal_size = None if wal is None else wal.safe_wal_size
        for state in WAL_STATUSES:
            current = wal is not None and wal.wal_status == state
            metrics.slot_wal_status.labels(name, state).set(1 if current else 0)
        if wal is None:
            return
        metrics.slot_retained_wal.labels(name).set(wal.retained_bytes)
        if wal.safe_wal_size is None:
            with contextlib.suppress(KeyError):
                metrics.slot_safe_wal_size.remove(name)
        else:
            metrics.slot_safe_wal_size.labels(name).set(wal.safe_wal_size)


class Heartbeat:
    """``heartbeat.statement`` on the publisher every ``heartbeat.interval`` (0: never)."""

    def __init__(self, config: SubscriptionConfig, conninfo: str) -> None:
        self.name = config.name
        self._interval = config.heartbeat.interval
        self._statement = config.heartbeat.statement
        self._conninfo = conninfo
        self._beat_at = time.monotonic()
        self.beats = 0

    def beat(self) -> None:
        """Run the statement when it is due; a failure is logged, never raised."""
        now = time.monotonic()
        if not self._interval or now - self._beat_at < self._interval:
            return
        self._beat_at = now
        try:
            with session.connect(self._conninfo, connect_timeout=10) as conn:
                conn.execute(self._statement.encode())
            self.beats += 1
        except psycopg.Error as exc:
            log.warning(
                "heartbeat failed",
                subscription=self.name,
                error=str(exc).strip(),
                hint="check heartbeat.statement and the role's rights on the publisher",
            )
