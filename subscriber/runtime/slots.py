"""A subscription's slots on the publisher: its own, and the table-sync workers'.

Its own slot is checked at every start (the publisher is the one recorded,
the slot is pgoutput's) and created only on the first start
(``subscriber.replication.slot.plan_slot``). Sync slots are dropped when
their table no longer needs one: by the coordinator when a table leaves or
is copied again, and at start for tables a crash left past their copy.
"""

from __future__ import annotations

import structlog

from subscriber.replication.commands import quote_literal
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.slot import PublisherIdentity, SlotAction, check_publisher, plan_slot
from subscriber.replication.stream import ReplicationConnection
from subscriber.runtime.config import SubscriptionConfig
from subscriber.runtime.settings import SubscriptionSettings
from tablesync.worker import is_sync_slot, sync_slot_name, sync_slot_relid

log = structlog.get_logger(__name__)

_SLOT_EXISTS = "SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = "


class SubscriptionSlots:
    def __init__(
        self, config: SubscriptionConfig, conninfo: str, settings: SubscriptionSettings
    ) -> None:
        self.name = config.name
        self._config = config
        self._conninfo = conninfo
        self._settings = settings
        self.system_id = ""  # the publisher's, known once ``ensure`` ran

    def ensure(self, flushed: Lsn) -> None:
        """Check the publisher and the slot; create the slot only on the first start."""
        slot = self._config.slot
        with ReplicationConnection(self._conninfo) as connection:
            system = connection.identify_system()
            found = PublisherIdentity(system.system_id, system.timeline)
            recorded = self._settings.publisher
            check_publisher(self.name, recorded, found)
            self.system_id = system.system_id
            rows = connection.execute(
                "SELECT plugin FROM pg_catalog.pg_replication_slots WHERE slot_name = "
                + quote_literal(slot)
            )
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
                connection.create_slot(slot, failover=self._config.failover)
        # Recorded once the slot exists: a crash in between leaves a first start.
        self._settings.record_publisher(found)

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
