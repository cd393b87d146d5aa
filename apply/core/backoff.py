"""How long to wait before trying a failed worker again: exponential, capped. Pure.

PostgreSQL's launcher restarts a failed apply worker after
``wal_retrieve_retry_interval``, every time. A daemon that runs for months
against an error that needs an operator (a dropped slot, a revoked grant)
would then retry - and log a full error - every few seconds forever, so the
wait doubles with each consecutive failure, up to ``max_retry_interval``,
and starts over once the worker made progress.
"""

from __future__ import annotations


def retry_delay(failures: int, base: float, cap: float) -> float:
    """The wait after ``failures`` consecutive failures (1 for the first)."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * 2.0 ** min(failures - 1, 62)))
