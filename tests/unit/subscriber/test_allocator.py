"""Arrow's allocator as pgsub's process sets it (``subscriber/__init__.py``): a page a batch
has freed goes back to the system, so that the next batch's peak does not stand on the last
one's."""

from __future__ import annotations

import os
import subprocess
import sys

FREED = """
import subscriber.runtime.cli  # as `pgsub run` starts
import pyarrow as pa

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20

before = rss_mb()
parts = [pa.array(range(i, i + 500_000), pa.int64()) for i in range(0, 25_000_000, 500_000)]
whole = pa.concat_arrays(parts)
held = rss_mb()
del parts, whole
print(pa.default_memory_pool().backend_name, before, held, rss_mb())
"""


def test_arrow_buffers_freed_leave_the_process() -> None:
    unset = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", FREED],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=unset,  # as a shell starts it (this process's import set it already)
    )
    pool, before, held, after = done.stdout.split()
    assert pool == "mimalloc"
    assert int(held) - int(before) > 350, done.stdout  # 400 MB of buffers were there
    assert int(after) - int(before) < 80, done.stdout  # and went back
