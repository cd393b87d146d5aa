"""The folders of a subscription's spool (``spool_dir``): their names, in one place. Pure.

- ``apply/``: the leader's spooled transactions (``apply.arrival.spool``), streamed
  ones and those larger than a batch; replaced at a start (the slot sends
  them again);
- ``sync-<relid>/``: a table-sync worker's, during its catch-up; replaced;
- ``staging/``: a large transaction's net effect, staged for one MERGE per
  table (``apply.plans.staging``); removed at a start;
- ``copy/<relid>/``: a copy's blocks staged for one local Spark commit
  (``apply.delta.copy``); removed at a start;
- ``copy-ranges/<relid>/``: a resumable copy's ranges (``tablesync.resume``);
  kept: the copy resumes from them.

Inside ``apply/`` and ``sync-<relid>/`` the spool's own files are named by
``apply.arrival.spool`` (a streamed transaction's is ``stream-<xid>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SpoolLayout:
    root: Path  # the subscription's spool_dir

    @property
    def leader(self) -> Path:
        return self.root / "apply"

    def sync_worker(self, relid: int) -> Path:
        return self.root / f"sync-{relid}"

    @property
    def staging(self) -> Path:
        return self.root / "staging"

    def copy(self, relid: int) -> Path:
        return self.root / "copy" / str(relid)

    @property
    def copy_ranges(self) -> Path:
        return self.root / "copy-ranges"

    def ranges_of(self, relid: int) -> Path:
        return self.copy_ranges / str(relid)

    @property
    def left_by_a_killed_run(self) -> tuple[Path, ...]:
        """What a start removes: stagings no restart can finish (every copy staged for
        Spark starts over; a staged large transaction is staged again from the slot)."""
        return (self.root / "copy", self.staging)
