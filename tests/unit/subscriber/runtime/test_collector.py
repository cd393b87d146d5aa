"""The daemon's process settings: the garbage collector's pace, Arrow's allocator."""

from __future__ import annotations

import gc
import subprocess
import sys
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


FREED = """
import pyarrow as pa
from subscriber.runtime.daemon import tune_process

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20

tune_process()
before = rss_mb()
parts = [pa.array(range(i, i + 500_000), pa.int64()) for i in range(0, 25_000_000, 500_000)]
whole = pa.concat_arrays(parts)
held = rss_mb()
del parts, whole
print(pa.default_memory_pool().backend_name, before, held, rss_mb())
"""


def test_arrow_memory_a_batch_freed_goes_back_to_the_system() -> None:
    """After ``tune_process`` (as `pgsub run` starts), 400 MB of Arrow buffers, once freed,
    leave the process's RSS: the next batch's peak does not stand on the last one's."""
    done = subprocess.run(
        [sys.executable, "-c", FREED], capture_output=True, text=True, check=True, timeout=120
    )
    pool, before, held, after = done.stdout.split()
    assert pool == "jemalloc"
    assert int(held) - int(before) > 350  # the buffers were there
    assert int(after) - int(before) < 60, done.stdout  # and are given back
