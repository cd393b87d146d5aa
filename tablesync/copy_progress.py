"""How far each table's copy is, for ``/status``: rows copied, rows estimated, rate, time left.

The sync workers report rows as they copy (``note``); ``figures`` gives
``/status``'s fields for a table, the rate and time left only while its
worker runs. Pure: the clock is handed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class CopyProgress:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rows: dict[int, tuple[int, int]] = {}  # relid: (copied, estimated)
        self._started: dict[int, float] = {}

    def note(self, relid: int, copied: int, estimated: int) -> None:
        self._started.setdefault(relid, self._clock())
        self._rows[relid] = (copied, estimated)

    def figures(self, relid: int, *, running: bool) -> dict[str, object]:
        """``rows_copied``, ``rows_estimated``, ``copy_rows_per_second`` and
        ``copy_seconds_left`` (None where unknown; the last two only while ``running``)."""
        copied, estimated = self._rows.get(relid, (None, None))
        rate = left = None
        started = self._started.get(relid)
        if running and started is not None and copied:
            per_second = copied / max(self._clock() - started, 1e-3)
            rate = round(per_second, 1)
            if estimated:
                left = round(max(0.0, estimated - copied) / per_second, 1)
        return {
            "rows_copied": copied,
            "rows_estimated": estimated,
            "copy_rows_per_second": rate,
            "copy_seconds_left": left,
        }
