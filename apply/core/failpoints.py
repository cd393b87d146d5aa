"""Named failpoints for crash tests: die like ``kill -9`` at a durable step.

``PGSUB_FAILPOINTS=apply.after_table_write`` (comma-separated; ``name=N``
fires on the N-th pass) makes the process send itself SIGKILL when it
reaches that point, so a test can prove that a crash exactly there loses
and duplicates nothing. Unset, a failpoint is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Final

ENV: Final = "PGSUB_FAILPOINTS"

NAMES: Final = frozenset(
    {
        "apply.after_table_write",  # one table committed, others of the batch maybe not
        "apply.before_checkpoint",  # every table committed, checkpoint not recorded
        "apply.before_flush_report",  # checkpoint recorded, flush not confirmed upstream
        "apply.after_piece",  # a piece of a spooled transaction committed, the rest not
        "apply.after_prepare_staged",  # a PREPARE staged, its checkpoint not recorded
        "apply.before_prepared_forgotten",  # COMMIT/ROLLBACK PREPARED done, staging kept
        "tablesync.after_copy_block",  # rows of a copy written, FINISHEDCOPY not stored
        "tablesync.after_range_staged",  # a range of a copy staged, others not (resumable)
        "tablesync.after_copy_landed",  # a staged copy in Delta, FINISHEDCOPY not stored
        "tablesync.before_syncdone",  # catch-up reached its LSN, SYNCDONE not stored
        "tablesync.after_syncdone",  # SYNCDONE stored, the sync slot not dropped yet
    }
)


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, count = item.partition("=")
        if name not in NAMES:
            raise ValueError(
                f"{ENV}: unknown failpoint {name!r}; known: {', '.join(sorted(NAMES))}"
            )
        armed[name] = int(count or 1)
    return armed


_armed: Final = _parse(os.environ.get(ENV, ""))
_lock: Final = threading.Lock()


def failpoint(name: str) -> None:
    if not _armed or name not in _armed:
        return
    with _lock:
        _armed[name] -= 1
        if _armed[name] > 0:
            return
    os.kill(os.getpid(), signal.SIGKILL)
