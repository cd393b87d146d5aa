"""The mark of a subscription's latest commit to a table: where the table's progress is.

A restart reads each table's LSN back from its history (docs/architecture.md,
"Durability"): the ``userMetadata`` of the newest commit that carries this
subscription's mark. On a local warehouse delta-rs reads the log (no Spark
job); otherwise ``DESCRIBE HISTORY``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from apply.core.records import lsn_from_metadata
from apply.delta.spark import sql as delta_sql
from apply.delta.writer.local_tables import newest_user_metadata, user_metadata

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)


def latest_mark(
    session: Callable[[], SparkSession], path: str, subscription: str, *, local: bool, peek: int
) -> str | None:
    """The ``userMetadata`` of ``subscription``'s latest commit to the table at ``path`` with
    an LSN (None: none).

    A subscription's LSNs only grow, so its newest marked commit holds the
    highest. The last ``peek`` commits are read first (where pgsub reaches the
    table, one at a time from the newest: most often the newest is the one); the
    whole history only when other writers (or maintenance) made all of those.
    """
    limits: tuple[int | None, ...] = (peek, None)
    if local:
        read = 0
        try:
            for metadata in newest_user_metadata(path, peek):
                read += 1
                if lsn_from_metadata(metadata, subscription) is not None:
                    return str(metadata)
        except (OSError, ValueError) as exc:
            log.warning(
                "cannot read the newest commits; reading the history", path=path, error=str(exc)
            )
        else:
            if read < peek:
                return None  # every commit the log holds read
            limits = (None,)
    for limit in limits:
        marks = _user_metadata(session, path, limit, local=local)
        for metadata in marks:
            if lsn_from_metadata(metadata, subscription) is not None:
                return str(metadata)
        if limit is not None and len(marks) < limit:
            break
    return None


def _user_metadata(
    session: Callable[[], SparkSession], path: str, limit: int | None, *, local: bool
) -> list[str | None]:
    """The ``userMetadata`` of the latest ``limit`` commits, newest first: from the log by
    delta-rs on a local warehouse (no Spark job), else by ``DESCRIBE HISTORY``."""
    if local:
        import deltalake

        try:
            return user_metadata(path, limit)
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            log.warning(
                "delta-rs cannot read the log; reading it with Spark", path=path, error=str(exc)
            )
    rows = delta_sql.history(session(), path, limit, ("version", "userMetadata"))
    return [row["userMetadata"] for row in rows]
