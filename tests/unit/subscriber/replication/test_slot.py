"""When a subscription's slot is created, and when its absence stops the subscription."""

import pytest

from subscriber.replication.errors import ReplicationError
from subscriber.replication.lsn import Lsn
from subscriber.replication.slot import (
    PublisherChangedError,
    PublisherIdentity,
    SlotAction,
    SlotMissingError,
    check_publisher,
    plan_slot,
)


def plan(**given: object) -> SlotAction:
    args: dict[str, object] = {
        "subscription": "s1",
        "slot": "s1",
        "exists": False,
        "plugin": None,
        "first_start": True,
        "create_slot": True,
        "confirmed": Lsn(0),
    }
    args.update(given)
    return plan_slot(**args)  # type: ignore[arg-type]


def test_the_first_start_creates_the_slot_and_later_ones_use_it() -> None:
    assert plan() is SlotAction.CREATE
    assert plan(exists=True, plugin="pgoutput", first_start=False) is SlotAction.USE


def test_a_vanished_slot_is_never_recreated() -> None:
    with pytest.raises(SlotMissingError) as err:
        plan(first_start=False, confirmed=Lsn.parse("0/1A2B3C"))
    message = str(err.value)
    assert 'replication slot "s1" does not exist' in message and "0/1A2B3C" in message
    assert "pgsub drop -c <config> s1" in message


def test_create_slot_off_and_a_foreign_plugin_are_errors() -> None:
    with pytest.raises(ReplicationError, match="set create_slot: true"):
        plan(create_slot=False)
    with pytest.raises(ReplicationError, match="test_decoding, not pgoutput"):
        plan(exists=True, plugin="test_decoding")


def test_another_publisher_is_refused_and_a_new_timeline_is_not() -> None:
    recorded = PublisherIdentity("7311", 1)
    check_publisher("s1", None, PublisherIdentity("9999", 1))
    check_publisher("s1", recorded, PublisherIdentity("7311", 2))  # promoted standby
    with pytest.raises(PublisherChangedError, match=r"system identifier 9999.*from 7311"):
        check_publisher("s1", recorded, PublisherIdentity("9999", 1))
