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
