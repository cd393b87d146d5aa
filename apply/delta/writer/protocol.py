"""Deletion vectors turned on for a table by pgsub's own commit, without Spark.

When a batch would rewrite far more than it changes (``apply.core.features.
write_gain``), the table gains deletion vectors with that batch, so that the
batch writes only its rows and a bitmap per file it touches. Spark's ``ALTER
TABLE ... SET TBLPROPERTIES`` would cost a JVM's start on a daemon that has
not needed one, and delta-rs's ``add_feature`` drops the legacy features a
table's writer version implies (and its property setter adds
``variantType``); so pgsub makes the actions Spark's commit would hold: a
``protocol`` with reader version 3 and writer version 7, ``deletionVectors``
among the reader and writer features, beside the ones the table's versions
implied (writer 2: ``appendOnly``, ``invariants``) and any it listed; and
the table's ``metaData`` with ``delta.enableDeletionVectors`` set. pgsub
makes them part of the batch's own commit, the one that first writes vectors
(``vectors_on_actions``): the table gains the feature at the version that
first uses it, and a batch after a start or an initial sync does not pay a
commit and a read of the log more for each of its tables (the first batch of
200 tables in a bucket took 3.1-3.8 s, where later ones took about one).
``vectors_on`` makes it a commit of its own.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import structlog

from apply.core.features import DELETION_VECTORS, Gain, excluded_readers
from apply.delta.writer.overwrite import ENGINE, commit

if TYPE_CHECKING:
    import deltalake

    from apply.delta.files.store import TableStore

log = structlog.get_logger(__name__)

# The writer features a legacy writer version implies (Delta's protocol, "Table Features").
_IMPLIED: Final = {1: (), 2: ("appendOnly", "invariants")}


@dataclass(frozen=True, slots=True)
class VectorsOn:
    """Deletion vectors turned on by the batch's own commit: its ``protocol`` and
    ``metaData`` actions (``vectors_on_actions``), what the open
    table's facts are once it is made (``OpenTable.moved_on``), and why (``write_gain``)."""

    actions: list[dict[str, object]]
    facts: dict[Hashable, Any]
    gain: Gain


def vectors_on(store: TableStore, table: deltalake.DeltaTable, version: int) -> None:
    """Deletion vectors on for ``table`` (in ``store``, at ``version``) by a commit of its
    own, as Spark's ``ALTER TABLE ... SET TBLPROPERTIES`` makes it. A version another writer
    made first is a ``CommitRacedError``."""
    now = int(time.time() * 1000)
    info = {
        "timestamp": now,
        "operation": "SET TBLPROPERTIES",
        "operationParameters": {"properties": f'{{"{DELETION_VECTORS}":"true"}}'},
        "engineInfo": ENGINE,
        "clientVersion": ENGINE,
    }
    commit(store, version + 1, [{"commitInfo": info}, *vectors_on_actions(table)])


def vectors_on_actions(table: deltalake.DeltaTable) -> list[dict[str, object]]:
    """The ``protocol`` and ``metaData`` actions that turn deletion vectors on for ``table``
    (its snapshot's protocol, schema and properties): a commit of their own
    (``vectors_on``), or the batch's own commit that first writes vectors
    (``apply.delta.writer.vector_write.write_by_vectors``) - a snapshot's protocol is the
    one of its latest commit that has one, that commit included."""
    protocol = table.protocol()
    readers = set(protocol.reader_features or ())
    writers = set(protocol.writer_features or ())
    if protocol.min_writer_version < 7:
        writers |= set(_IMPLIED[protocol.min_writer_version])
    readers.add("deletionVectors")
    writers.add("deletionVectors")
    metadata = table.metadata()
    configuration = {**metadata.configuration, DELETION_VECTORS: "true"}
    return [
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
