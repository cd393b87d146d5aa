"""The benchmarks' memory figures: peak RSS of this process and of Spark's JVM, sampled
while a run lasts (``Sampled``), and the PSS of pgsub's writer processes."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path
from typing import Any, Self


def _field(path: str, name: str) -> int | None:
    """The number after ``name:`` in a ``/proc`` file of ``Name: value`` lines (kB where
    it has a unit); None when the file or the line is gone."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    lead = f"{name}:"
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(lead)), None)


def vm_hwm_mb(pid: int) -> float | None:
    """A live process's peak resident memory (VmHWM), MB."""
    kb = _field(f"/proc/{pid}/status", "VmHWM")
    return None if kb is None else kb / 1024


def jvm_peak_rss_mb() -> float | None:
    """VmHWM of this process's Spark driver JVM."""
    for pid in children(os.getpid()):
        if b"java" in command(pid):
            return vm_hwm_mb(pid)
    return None


def jvm_text(mb: float | None) -> str:
    """A scenario's JVM figure as the benchmarks print it: none when no table needed Spark
    (the daemon starts it on demand)."""
    return "no JVM" if mb is None else f"{mb:,.0f}"


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == pid]


def command(pid: int) -> bytes:
    """A process's command line (NUL-separated); empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class Sampled:
    """Something sampled every ``interval`` seconds by a thread of its own, inside a ``with``
    block (``sample``, given the seconds since the block began)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample(time.monotonic() - self._started)
            if self._done.wait(self.interval):
                return

    def sample(self, at: float) -> None:
        raise NotImplementedError


class ResidentMemory(Sampled):
    """This process's resident memory (MB), sampled every ``interval`` seconds inside a
    ``with`` block: what a run of an hour holds at its end against its start, where the
    peak alone would not tell growth from a spike."""

    def __init__(self, interval: float) -> None:
        super().__init__(interval)
        self.samples: list[tuple[float, float]] = []  # (seconds since the start, MB)
        self._page = os.sysconf("SC_PAGE_SIZE")

    def sample(self, at: float) -> None:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        self.samples.append((at, pages * self._page / 2**20))

    def peaks(self, seconds: float) -> list[float]:
        """The largest sample of each span of ``seconds`` from the start."""
        spans: dict[int, float] = {}
        for at, mb in self.samples:
            span = int(at // seconds)
            spans[span] = max(mb, spans.get(span, 0.0))
        return [spans[i] for i in sorted(spans)]


def peak_rss() -> dict[str, float | None]:
    """This process's peak RSS and its Spark driver JVM's, in MB, as the scenarios report
    them (call it while the JVM runs)."""
    return {
        "peak_rss_python_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_jvm_mb": jvm_peak_rss_mb(),
    }


def writer_peaks_mb(tables: Any) -> list[int]:
    """Each running writer process's peak RSS (``VmHWM``), in MB."""
    return [int(mb) for pid in tables.writer_pids() if (mb := vm_hwm_mb(pid)) is not None]


class WriterMemory(Sampled):
    """The peak of the writer processes' and their server's memory together, sampled each
    second: their proportional set size (PSS: a page shared by n processes counts 1/n in
    each), since the processes share the pages of the server they are forked from - the
    sum of their peak RSS counts those once a process."""

    def __init__(self, tables: Any) -> None:
        super().__init__(1.0)
        self.peak_mb = 0.0
        self._tables = tables

    def sample(self, at: float) -> None:
        pids = set(self._tables.writer_pids())
        pids |= {parent for pid in pids if (parent := _parent(pid)) is not None}
        self.peak_mb = max(self.peak_mb, pss_mb(pids))


def pss_mb(pids: set[int]) -> float:
    """The processes' proportional set size together, MB (a gone one counts 0)."""
    return sum(_pss_kb(pid) for pid in pids) / 1024


def _parent(pid: int) -> int | None:
    return _field(f"/proc/{pid}/status", "PPid")


def _pss_kb(pid: int) -> int:
    return _field(f"/proc/{pid}/smaps_rollup", "Pss") or 0
