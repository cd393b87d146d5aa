"""A maintenance round spreads its tables over half its interval, and rounds keep their
cadence."""

from __future__ import annotations

import threading
from typing import Any, cast

from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.maintenance import Maintenance, _Pace


class Clock:
    """A clock that moves only when told, and an Event whose waits move it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now


class Stopping(threading.Event):
    def __init__(self, clock: Clock, *, stop_after: int | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.stop_after = stop_after

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.clock.waits.append(round(timeout, 6))
        self.clock.now += timeout
        if self.stop_after is not None and len(self.clock.waits) >= self.stop_after:
            self.set()
        return self.is_set()


def test_each_table_waits_for_its_share_of_the_spread() -> None:
    clock = Clock()
    pace = _Pace(clock, spread=100.0, count=4, stopping=Stopping(clock), started=clock())
    clock.now += 10.0  # the first table took 10 s of its 25
    assert pace.next_turn()
    clock.now += 40.0  # the second took 40 s: 15 s behind its turn at 50 s, no wait
    assert pace.next_turn()
    assert pace.next_turn()  # the third took nothing: waits to its turn at 75 s
    assert clock.waits == [15.0, 10.0]
    assert clock.now == 175.0


def test_a_round_without_stopping_does_not_wait_and_stopping_ends_the_wait() -> None:
    clock = Clock()
    free = _Pace(clock, spread=100.0, count=4, stopping=None, started=clock())
    assert free.next_turn() and free.next_turn() and clock.now == 100.0
    stopped = _Pace(
        clock, spread=100.0, count=4, stopping=Stopping(clock, stop_after=1), started=clock()
    )
    assert not stopped.next_turn()  # stopped while waiting: the round ends


def test_rounds_start_one_interval_apart_or_half_one_after_a_long_round(
    monkeypatch: Any,
) -> None:
    clock = Clock()
    lengths = iter([30.0, 500.0, 10.0])
    starts: list[float] = []

    def round_(self: Maintenance, stopping: threading.Event | None = None) -> None:
        starts.append(clock.now)
        clock.now += next(lengths)

    monkeypatch.setattr(Maintenance, "round", round_)
    config = MaintenanceConfig(interval=300)
    done = Maintenance([], cast("Any", None), "/nowhere", config, cast("Any", None), clock=clock)
    done.run(Stopping(clock, stop_after=4))
    # 300 s after the start; 300 s after the first's start; 150 s after the long one's end
    assert starts == [400.0, 700.0, 1350.0]
