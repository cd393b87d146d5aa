"""Whether a batch turns deletion vectors on for its table, and what turns them on.

With ``table_features.deletion_vectors: auto`` a table gains deletion vectors
by what its writes cost (docs/tables.md, "What a batch writes"): before a
keyed batch pgsub's own writer foresees what it would rewrite without them -
the whole table when it is small enough to be rewritten whole, else every
live file whose key range holds one of the batch's keys
(``apply.delta.writer.write_cost``) - and what it writes with them, and
``apply.core.features.write_gain`` weighs the two. When they pay, the
batch's own commit turns them on (``VectorsOn``: the actions of
``apply.delta.writer.protocol``, and what the open table knows once they
are committed), and the batch is written with them
(``apply.delta.writer.vector_write``).
"""

from __future__ import annotations

from collections.abc import Hashable
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from apply.batching.source import PRESENT, KeyedSource
from apply.core.features import FeatureMode, TableFeatures, write_gain
from apply.delta.writer import delta_rs_merge
from apply.delta.writer.delta_rs_merge import table_types
from apply.delta.writer.key_index import lookup_keys
from apply.delta.writer.local_tables import delta_rs_writes
from apply.delta.writer.protocol import VectorsOn, vectors_on_actions
from apply.delta.writer.vector_write import vectors_allowed
from apply.delta.writer.write_cost import DEFAULT_ROW_BYTES, rewrite_bytes

if TYPE_CHECKING:
    import deltalake

    from apply.columns.schema import TargetSchema
    from apply.delta.writer.open_table import OpenTable


def vectors_pay(
    open_table: OpenTable,
    schema: TargetSchema,
    source: KeyedSource,
    features: TableFeatures,
) -> VectorsOn | None:
    """Whether the batch ``source`` would rewrite far more of the table than it writes with
    deletion vectors (``features``: whether they may be turned on, and the factor); if so,
    what turns them on in the batch's own commit, which writes it with them."""
    if features.deletion_vectors is not FeatureMode.AUTO:
        return None
    if not open_table.fact(("vectors_may_pay", schema.key), partial(_vectors_may, schema=schema)):
        return None
    types = table_types(open_table, schema)
    if types is None or lookup_keys(types, schema.key) is None:
        return None  # the vector path could not look its keys up
    files = open_table.files()
    size = sum(f.size for f in files)
    rows = sum(f.rows or 0 for f in files)
    if size <= delta_rs_merge.REWRITE_MAX_BYTES:  # read at the call: tests lower it
        rewrite = size  # rewritten whole
    else:
        first = schema.key[0]
        rewrite = rewrite_bytes(open_table.synced(), first, source.table[first])
    written = pc.sum(pc.cast(source.table[PRESENT], pa.int64())).as_py() or 0
    per_row = size // rows if rows else DEFAULT_ROW_BYTES
    gain = write_gain(open_table.configuration, rewrite, written, per_row, features)
    if gain is None:
        return None
    # The snapshot's protocol, schema and properties are current even when it has not
    # read pgsub's own last commit (``OpenTable``).
    actions = vectors_on_actions(open_table.table)
    metadata = actions[-1]["metaData"]
    assert isinstance(metadata, dict)
    facts: dict[Hashable, Any] = {
        "arrow_schema": open_table.arrow_schema,  # the schema stays
        ("table_types", schema.columns): types,
        "configuration": dict(metadata["configuration"]),
        ("vector_writable", schema.key): True,
    }
    return VectorsOn(actions, facts, gain)


def _vectors_may(table: deltalake.DeltaTable, schema: TargetSchema) -> bool:
    """Whether ``table``'s protocol and properties let its batches be written with deletion
    vectors once they are on, by pgsub's own writer (``vectors_allowed``, ``delta_rs_writes``):
    asked at every batch of a table they do not pay for yet, so kept as a fact of its snapshot."""
    return vectors_allowed(table, schema) and delta_rs_writes(table.protocol())
