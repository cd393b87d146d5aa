"""The daemon's garbage collector settings."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from subscriber.runtime.daemon import COLLECTOR_THRESHOLD, tune_garbage_collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_the_daemon_collects_less_often_and_not_over_startup_objects(
    restored_collector: None,
) -> None:
    _, older, oldest = gc.get_threshold()
    made_at_startup: list[list[int]] = [[] for _ in range(100)]  # containers the collector tracks
    tune_garbage_collector()
    assert gc.get_threshold() == (COLLECTOR_THRESHOLD, older, oldest)
    assert gc.get_freeze_count() >= len(made_at_startup)


def test_cycles_are_still_reclaimed_at_the_daemons_pace(restored_collector: None) -> None:
    """Fewer runs, not none: garbage that only the collector frees (a reference cycle) is
    freed within ``COLLECTOR_THRESHOLD`` new containers, so it never accumulates."""
    tune_garbage_collector()
    runs = gc.get_stats()[0]["collections"]
    for _ in range(COLLECTOR_THRESHOLD):  # a cycle of two lists each: twice the threshold
        first: list[object] = []
        first.append([first])
    assert gc.get_stats()[0]["collections"] > runs
    assert len(gc.get_objects(generation=0)) < COLLECTOR_THRESHOLD
