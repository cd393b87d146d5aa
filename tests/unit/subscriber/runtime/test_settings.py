"""SubscriptionSettings: the two-phase state machine and the record of created tables."""

import pytest

from subscriber.replication.errors import SubscriberError
from subscriber.runtime.settings import SubscriptionSettings


class MemoryLog:
    """The settings log in memory: every write kept, the latest value per key loaded."""

    def __init__(self) -> None:
        self.writes: list[list[tuple[str, str]]] = []

    def load(self, subscription: str) -> dict[str, str]:
        latest = {k: v for write in self.writes for k, v in write}
        return {k: v for k, v in latest.items() if v}

    def record(self, subscription: str, key: str, value: str, *more: tuple[str, str]) -> None:
        self.writes.append([(key, value), *more])


def test_two_phase_is_pending_until_every_table_is_ready_then_enabled_for_good() -> None:
    log = MemoryLog()
    settings = SubscriptionSettings("sub1", log)
    assert settings.advance_two_phase(False, all_ready=False, slot="sub1") == "off"
    assert log.writes == []
    assert settings.advance_two_phase(True, all_ready=False, slot="sub1") == "pending"
    assert settings.advance_two_phase(True, all_ready=False, slot="sub1") == "pending"
    assert settings.advance_two_phase(True, all_ready=True, slot="sub1") == "enabled"
    assert log.writes == [[("two_phase", "pending")], [("two_phase", "enabled")]]
    with pytest.raises(SubscriberError, match="'sub1' sends prepared transactions"):
        settings.advance_two_phase(False, all_ready=True, slot="sub1")
    again = SubscriptionSettings("sub1", log)
    again.refresh(force=True)
    assert again.advance_two_phase(True, all_ready=False, slot="sub1") == "enabled"


def test_tables_created_together_are_recorded_in_one_write_and_only_once() -> None:
    log = MemoryLog()
    settings = SubscriptionSettings("sub1", log)
    settings.record_created("public.a", "public.b", "public.c")
    assert len(log.writes) == 1
    settings.record_created("public.b")  # known already: nothing written
    settings.record_created("public.b", "public.d")
    assert log.writes[1:] == [[("created:public.d", "true")]]
    fresh = SubscriptionSettings("sub1", log)
    fresh.refresh(force=True)
    assert all(fresh.was_created(t) for t in ("public.a", "public.b", "public.c", "public.d"))
    assert not fresh.was_created("public.e")
