"""How maintenance keeps tables bounded, as values: what is compacted, how much history stays.

Pure, so that the config can hold it without importing Spark;
``apply.delta.spark.maintenance`` does the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DAY: Final = 86400.0
# A data file whose rows deletion vectors have removed past this share is rewritten with its
# alive rows only (Delta's OPTIMIZE default, 5%, rewrites a big table updated at random every
# few minutes): by maintenance's OPTIMIZE, and by pgsub's own writes
# (apply.delta.writer.vector_write).
# Each row deleted costs (1 - share) / share rows rewritten: 2.3 at 30%, 1 at half; a reader
# reads at most twice a file's live rows.
PURGE_ABOVE: Final = 0.5
# VACUUMs (LITE: seconds, beside the writers) within one retention, at least.
VACUUMS_PER_RETENTION: Final = 4


@dataclass(frozen=True, slots=True)
class MaintenancePolicy:
    compact_files: int = 64
    vacuum_interval: float = DAY
    retention: float = 7 * DAY

    @property
    def vacuum_every(self) -> float:
        """Seconds between a table's VACUUMs: ``vacuum_interval``, or a quarter of
        ``retention`` when shorter - files replaced then stay a retention and a quarter at
        most, not a whole interval more (a table rewritten at every batch fills a disk in
        hours). Once per retention, as in the 150-minute soak, the warehouse was a
        sawtooth between one and two retentions of replaced files (docs/performance.md)."""
        return min(self.vacuum_interval, self.retention / VACUUMS_PER_RETENTION)


DEFAULT_POLICY: Final = MaintenancePolicy()


def retention_properties(policy: MaintenancePolicy) -> dict[str, str]:
    """The table properties that bound a table's history to ``policy.retention``."""
    hours = max(1, round(policy.retention / 3600))
    interval = f"interval {hours} hours"
    return {
        "delta.logRetentionDuration": interval,
        "delta.deletedFileRetentionDuration": interval,
        "delta.setTransactionRetentionDuration": interval,
    }
