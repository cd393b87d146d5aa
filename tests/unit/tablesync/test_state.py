"""The table lifecycle: PostgreSQL's states and only its transitions."""

import pytest

from subscriber.replication.lsn import Lsn
from tablesync.state import WITHOUT_LSN, IllegalTransitionError, TableState, TableStatus

S = TableState


def status(state: TableState, lsn: int | None = None) -> TableStatus:
    return TableStatus(16384, "public", "t", state, None if lsn is None else Lsn(lsn))


def test_the_sync_path_in_order_each_state_with_its_lsn() -> None:
    table = status(S.INIT).moved_to(S.DATASYNC)
    table = table.moved_to(S.FINISHEDCOPY, Lsn(10))
    assert table.snapshot == Lsn(10)
    table = table.moved_to(S.SYNCWAIT, Lsn(10)).moved_to(S.CATCHUP, Lsn(20))
    assert table.catchup_to == Lsn(20)
    table = table.moved_to(S.SYNCDONE, Lsn(25))
    assert table.synced_to == Lsn(25)
    table = table.moved_to(S.READY, Lsn(30))
    assert table.state is S.READY and table.ready_at == Lsn(30)


@pytest.mark.parametrize("state", [S.FINISHEDCOPY, S.SYNCWAIT, S.CATCHUP, S.SYNCDONE])
def test_a_state_that_carries_an_lsn_refuses_none(state: TableState) -> None:
    with pytest.raises(IllegalTransitionError, match=f"{state.name} needs an LSN"):
        status(state)


@pytest.mark.parametrize("state", [S.INIT, S.DATASYNC])
def test_a_state_without_an_lsn_refuses_one(state: TableState) -> None:
    with pytest.raises(IllegalTransitionError, match=f"{state.name} has no LSN"):
        status(state, 5)


def test_ready_may_have_no_lsn_as_refresh_adds_it_without_a_copy() -> None:
    assert status(S.READY).ready_at is None


def test_an_lsn_read_for_another_state_is_a_bug() -> None:
    with pytest.raises(IllegalTransitionError, match="is CATCHUP, not SYNCDONE"):
        _ = status(S.CATCHUP, 5).synced_to
    with pytest.raises(IllegalTransitionError, match="is SYNCDONE, not READY"):
        _ = status(S.SYNCDONE, 5).ready_at


def test_copy_data_false_goes_straight_to_ready() -> None:
    assert status(S.INIT).moved_to(S.READY, Lsn(1)).state is S.READY


def test_a_failed_copy_starts_over() -> None:
    assert status(S.DATASYNC).moved_to(S.DATASYNC).state is S.DATASYNC


@pytest.mark.parametrize(
    ("start", "to"),
    [(S.INIT, S.SYNCDONE), (S.DATASYNC, S.READY), (S.SYNCWAIT, S.SYNCDONE), (S.READY, S.INIT)],
)
def test_skipping_a_step_is_a_bug(start: TableState, to: TableState) -> None:
    with pytest.raises(IllegalTransitionError, match=f"{start.name} -> {to.name}"):
        status(start, None if start in WITHOUT_LSN else 1).moved_to(to, Lsn(2))


def test_only_syncwait_and_catchup_live_in_memory() -> None:
    assert {s for s in S if not s.stored} == {S.SYNCWAIT, S.CATCHUP}


def test_the_leader_applies_ready_and_syncdone_after_its_lsn() -> None:
    assert status(S.READY, 5).applies(Lsn(1))
    assert status(S.SYNCDONE, 100).applies(Lsn(100))
    assert not status(S.SYNCDONE, 100).applies(Lsn(99))
    for state in (S.INIT, S.DATASYNC):
        assert not status(state).applies(Lsn(1000))
    for state in (S.FINISHEDCOPY, S.SYNCWAIT, S.CATCHUP):
        assert not status(state, 1).applies(Lsn(1000))
