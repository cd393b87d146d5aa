"""The subscription's replication slot on the publisher: when to create it, when it must exist.

PostgreSQL creates a subscription's slot once, at ``CREATE SUBSCRIPTION``,
and its apply worker never creates it again: a slot that vanished later
(dropped by hand, lost in a failover) means the changes since the last
confirmed position are gone, and the worker fails with ``replication slot
"x" does not exist`` until an operator acts. Creating a fresh slot instead
would resume from the new slot's start and silently skip everything in
between. ``plan_slot`` is that rule, pure; ``PublisherIdentity`` is what a
subscription records of its publisher on its first start, so that a
different server behind the same address (a restore, a new cluster) is
refused rather than read from a position that means nothing there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from subscriber.replication.errors import ReplicationError
from subscriber.replication.lsn import Lsn


class SlotMissingError(ReplicationError):
    """The subscription's slot is gone: changes since the last confirmed LSN cannot be had."""


class PublisherChangedError(ReplicationError):
    """The publisher is not the server this subscription replicated from."""


class SlotAction(Enum):
    USE = "use"
    CREATE = "create"


@dataclass(frozen=True, slots=True)
class PublisherIdentity:
    """What a subscription records of its publisher (``IDENTIFY_SYSTEM``)."""

    system_id: str
    timeline: int


def check_publisher(
    subscription: str, recorded: PublisherIdentity | None, found: PublisherIdentity
) -> None:
    """Refuse a publisher whose system identifier differs from the one recorded."""
    if recorded is not None and recorded.system_id != found.system_id:
        raise PublisherChangedError(
            f'subscription "{subscription}": the publisher has system identifier '
            f"{found.system_id}, but this subscription replicated from {recorded.system_id}; "
            "its positions mean nothing on another server. Point the connection back at the "
            f"original publisher, or start over: `pgsub drop -c <config> {subscription}`, "
            "then run it again (every table is copied anew)"
        )


def plan_slot(
    *,
    subscription: str,
    slot: str,
    exists: bool,
    plugin: str | None,
    first_start: bool,
    create_slot: bool,
    confirmed: Lsn,
) -> SlotAction:
    """Whether to use or create ``slot``; raises when it may not be used or created."""
    if exists:
        if plugin != "pgoutput":
            raise ReplicationError(
                f'replication slot "{slot}" uses the plugin {plugin}, not pgoutput; '
                "drop it or choose another slot_name"
            )
        return SlotAction.USE
    if not first_start:
        raise SlotMissingError(
            f'replication slot "{slot}" does not exist on the publisher (subscription '
            f'"{subscription}", last confirmed LSN {confirmed}): changes after that position '
            "cannot be streamed again, so the slot is not recreated. Start over with "
            f"`pgsub drop -c <config> {subscription}` and run it again (every table is "
            "copied anew), or recreate the slot by hand and accept the gap"
        )
    if not create_slot:
        raise ReplicationError(
            f'replication slot "{slot}" does not exist on the publisher; create it '
            "(pgoutput) or set create_slot: true"
        )
    return SlotAction.CREATE
