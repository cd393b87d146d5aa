"""Maintenance's commits by delta-rs, where pgsub reaches the table: no JVM.

Maintenance compacts a table's small files past ``compact_files``. Spark's
OPTIMIZE of ``_pgsub/checkpoints`` in a bucket took 12-13 s on this machine
(a JVM started for it, its snapshot read through S3A), while the apply
worker's checkpoint waited for it: an 8.5-s batch of 200 tables
(docs/performance.md, "VACUUM without Spark"). A table of at most
``COMPACT_BELOW`` bytes, which delta-rs writes (no deletion vectors, no
feature it lacks), is compacted by delta-rs's ``optimize.compact`` instead:
every file of it is one Spark's OPTIMIZE would take too (it takes the files
below that size), into files of up to ``COMPACT_INTO``.

The history's properties (``apply.core.maintenance_policy.retention_properties``)
are set the same way (``properties_set_here``): the state tables are made by
delta-rs without them, and each daemon's first round set them by a Spark
commit - a JVM started for three properties, 9 s of the worker's checkpoint
waiting for it in a bucket (docs/performance.md, "Properties by delta-rs").

Each commit carries the table's mark, as Spark's does, and the table's
checkpoint comes at a version of its own (``apply.delta.writer.overwrite.keep_log``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from apply.core.errors import TargetTableError
from apply.delta.files.store import table_store
from apply.delta.writer.local_tables import delta_rs_writes, no_checkpoint, opened, reachable
from apply.delta.writer.overwrite import keep_log

if TYPE_CHECKING:
    import deltalake


def compacted_here(path: str, size: int, *, below: int, into: int, mark: str | None) -> bool:
    """Compact the table at ``path`` (``size`` bytes of data) by delta-rs, carrying ``mark``
    (its ``userMetadata``), if pgsub reaches it, delta-rs writes it and it holds at most
    ``below`` bytes; False, untouched, otherwise (Spark's OPTIMIZE is for it)."""
    if size > below:
        return False
    return _committed_here(
        path,
        "compaction",
        lambda table, carried: table.optimize.compact(
            target_size=into,
            commit_properties=carried,
            post_commithook_properties=no_checkpoint(),
        ),
        mark,
    )


def properties_set_here(path: str, properties: Mapping[str, str], *, mark: str | None) -> bool:
    """Set ``properties`` on the table at ``path`` by delta-rs (the others it has stay),
    carrying ``mark``, if pgsub reaches it and delta-rs writes it; False, untouched,
    otherwise (Spark's ALTER TABLE is for it)."""
    return _committed_here(
        path,
        "setting the properties",
        lambda table, carried: table.alter.set_table_properties(
            dict(properties),
            commit_properties=carried,
            post_commithook_properties=no_checkpoint(),
        ),
        mark,
    )


def _committed_here(
    path: str,
    what: str,
    commit: Callable[[deltalake.DeltaTable, deltalake.CommitProperties | None], object],
    mark: str | None,
) -> bool:
    """``commit(table, its mark's commit properties)`` by delta-rs, then the table's
    checkpoint if due; False where pgsub does not reach the table or delta-rs may not
    write it. The table is opened once, its protocol read from that snapshot (the
    process's kept log of it, ``delta_rs_can_write``'s, would first be brought over every
    commit since it was last read)."""
    if not reachable(path):
        return False
    import deltalake

    try:
        table = opened(path)
    except (deltalake.exceptions.DeltaError, OSError):
        return False  # as ``delta_rs_can_write`` answers a log it cannot read
    if not delta_rs_writes(table.protocol()):
        return False
    carried = (
        None if mark is None else deltalake.CommitProperties(custom_metadata={"userMetadata": mark})
    )
    try:
        commit(table, carried)
        keep_log(table, table_store(path).location)
    except (deltalake.exceptions.DeltaError, OSError) as exc:
        raise TargetTableError(f"{what} of {path} by delta-rs failed: {exc}") from exc
    return True
