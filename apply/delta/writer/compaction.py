"""OPTIMIZE of a small table by delta-rs, where pgsub reaches it: no JVM.

Maintenance compacts a table's small files past ``compact_files``. Spark's
OPTIMIZE of ``_pgsub/checkpoints`` in a bucket took 12-13 s on this machine
(a JVM started for it, its snapshot read through S3A), while the apply
worker's checkpoint waited for it: an 8.5-s batch of 200 tables
(docs/performance.md, "VACUUM without Spark"). A table of at most
``COMPACT_BELOW`` bytes, which delta-rs writes (no deletion vectors, no
feature it lacks), is compacted by delta-rs's ``optimize.compact`` instead:
every file of it is one Spark's OPTIMIZE would take too (it takes the files
below that size), into files of up to ``COMPACT_INTO``. Its commit carries
the table's mark, as Spark's does, and the table's checkpoint comes at a
version of its own (``apply.delta.writer.overwrite.keep_log``).
"""

from __future__ import annotations

from apply.core.errors import TargetTableError
from apply.delta.files.store import table_store
from apply.delta.writer.local_tables import delta_rs_can_write, no_checkpoint, opened, reachable
from apply.delta.writer.overwrite import keep_log


def compacted_here(path: str, size: int, *, below: int, into: int, mark: str | None) -> bool:
    """Compact the table at ``path`` (``size`` bytes of data) by delta-rs, carrying ``mark``
    (its ``userMetadata``), if pgsub reaches it, delta-rs writes it and it holds at most
    ``below`` bytes; False, untouched, otherwise (Spark's OPTIMIZE is for it)."""
    if size > below or not reachable(path) or not delta_rs_can_write(path):
        return False
    import deltalake

    properties = (
        None if mark is None else deltalake.CommitProperties(custom_metadata={"userMetadata": mark})
    )
    try:
        table = opened(path)
        table.optimize.compact(
            target_size=into,
            commit_properties=properties,
            post_commithook_properties=no_checkpoint(),
        )
        keep_log(table, table_store(path).location)
    except (deltalake.exceptions.DeltaError, OSError) as exc:
        raise TargetTableError(f"compaction of {path} by delta-rs failed: {exc}") from exc
    return True
