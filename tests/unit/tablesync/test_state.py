"""The table lifecycle: PostgreSQL's states and only its transitions."""

import pytest

from subscriber.replication.lsn import Lsn
from tablesync.state import IllegalTransitionError, TableState, TableStatus

S = TableState


def status(state: TableState, lsn: int | None = None) -> TableStatus:
    return TableStatus(16384, "public", "t", state, None if lsn is None else Lsn(lsn))


def test_the_sync_path_in_order() -> None:
    table = status(S.INIT)
    for state in (S.DATASYNC, S.FINISHEDCOPY, S.SYNCWAIT, S.CATCHUP, S.SYNCDONE, S.READY):
        table = table.moved_to(state, Lsn(100))
    assert table.state is S.READY


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
        status(start).moved_to(to)


def test_only_syncwait_and_catchup_live_in_memory() -> None:
    assert {s for s in S if not s.stored} == {S.SYNCWAIT, S.CATCHUP}


def test_the_leader_applies_ready_and_syncdone_after_its_lsn() -> None:
    assert status(S.READY, 5).applies(Lsn(1))
    assert status(S.SYNCDONE, 100).applies(Lsn(100))
    assert not status(S.SYNCDONE, 100).applies(Lsn(99))
    for state in (S.INIT, S.DATASYNC, S.FINISHEDCOPY, S.SYNCWAIT, S.CATCHUP):
        assert not status(state, 1).applies(Lsn(1000))
