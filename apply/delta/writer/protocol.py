"""Deletion vectors turned on for a table by pgsub's own commit, without Spark.

When a batch would rewrite far more than it changes (``apply.core.features.
write_gain``), the table gains deletion vectors before that batch is
written, so that the batch itself writes only its rows and a bitmap per file
it touches. Spark's ``ALTER TABLE ... SET TBLPROPERTIES`` would cost a
JVM's start on a daemon that has not needed one, and delta-rs's
``add_feature`` drops the legacy features a table's writer version implies
(and its property setter adds ``variantType``); so pgsub makes the commit
Spark would make, in one version: a ``protocol`` with reader version 3 and
writer version 7, ``deletionVectors`` among the reader and writer
features, beside the ones the table's versions implied (writer 2:
``appendOnly``, ``invariants``) and any it listed; and the table's
``metaData`` with ``delta.enableDeletionVectors`` set. The rows stay where
they are; the next commit writes vectors.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import structlog

from apply.core.features import DELETION_VECTORS, Gain, excluded_readers
from apply.delta.writer.overwrite import ENGINE, commit

if TYPE_CHECKING:
    import deltalake

    from apply.delta.files.store import TableStore

log = structlog.get_logger(__name__)

# The writer features a legacy writer version implies (Delta's protocol, "Table Features").
_IMPLIED: Final = {1: (), 2: ("appendOnly", "invariants")}


def vectors_on(store: TableStore, table: deltalake.DeltaTable, version: int) -> None:
    """Deletion vectors on for ``table`` (in ``store``, at ``version``) by one commit: its
    protocol upgraded to list them, its ``delta.enableDeletionVectors`` set. A version
    another writer made first is a ``CommitRacedError``."""
    protocol = table.protocol()
    readers = set(protocol.reader_features or ())
    writers = set(protocol.writer_features or ())
    if protocol.min_writer_version < 7:
        writers |= set(_IMPLIED[protocol.min_writer_version])
    readers.add("deletionVectors")
    writers.add("deletionVectors")
    metadata = table.metadata()
    configuration = {**metadata.configuration, DELETION_VECTORS: "true"}
    now = int(time.time() * 1000)
    actions: list[dict[str, object]] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "SET TBLPROPERTIES",
                "operationParameters": {"properties": f'{{"{DELETION_VECTORS}":"true"}}'},
                "engineInfo": ENGINE,
                "clientVersion": ENGINE,
            }
        },
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": sorted(readers),
                "writerFeatures": sorted(writers),
            }
        },
        {
            "metaData": {
                "id": metadata.id,
                "name": metadata.name,
                "description": metadata.description,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": table.schema().to_json(),
                "partitionColumns": list(metadata.partition_columns),
                "configuration": configuration,
                "createdTime": metadata.created_time,
            }
        },
    ]
    commit(store, version + 1, actions)


def warn_gained(table: str, gain: Gain) -> None:
    """The warning a table gaining a reader feature gives (by pgsub's commit or Spark's)."""
    log.warning(
        "target table gains a reader feature",
        table=table,
        feature=gain.feature,
        reason=gain.reason,
        excludes=excluded_readers(gain.feature),
        detail="the readers it excludes can no longer open the table; docs/tables.md, "
        '"Which reader opens what", lists who can',
    )
