"""Which Delta table features a target table carries: only those its data needs. Pure.

A Delta reader must understand every *reader* feature a table lists, or it
refuses the whole table. Spark reads them all; delta-rs 1.6 (Python's
``deltalake``, polars) reads ``timestampNtz`` but neither column mapping
nor type widening, and deletion vectors only through its ``QueryBuilder``
(docs/tables.md keeps the table of readers). So a target table starts with
none of those three unless the subscription asks for them
(``table_features``), and gains one only when its data needs it:

- column mapping, when a column name is one Delta cannot store without it
  (a space or one of ``,;{}()=``, a tab or a newline);
- type widening, the first time a column's type widens on the publisher
  (int -> bigint, ...);
- deletion vectors, when a batch would otherwise rewrite more than
  ``rewrite_factor`` (4) times what it writes with them (``write_gain``):
  the files it touches against its own rows, a vector file and the
  commit. Without them a batch rewrites every file its keys touch - a
  1M-row table's one 41-MB file for a batch of ten updates, every second
  (docs/performance.md, "What a batch writes"); with them it writes its
  rows and a bitmap per touched file. A batch that changes much of a small
  table rewrites it, and so does any batch of a table of 64 KiB or less
  (``VECTORS_MIN_REWRITE``): the table stays readable by every reader. A
  table holding more than ``deletion_vectors_above`` (256 MiB) of Parquet
  gains them whatever its batches (``size_gain``): past it pgsub's
  MERGEs leave delta-rs for Spark.

Each mode is ``auto`` (as above), ``always`` (from creation) or ``never``
(a table that would need column mapping or type widening stops with an
error naming the column; a big table is rewritten by every MERGE).

Delta's change data feed (``change_data_feed``) is a writer feature, on
request only: readers that lack it read the table as before; pgsub then
writes the table by Spark alone (delta-rs and pgsub's own commits would
record no row-level changes, and the tables' protocol tells them so).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from apply.core.errors import ApplyError

COLUMN_MAPPING: Final = "delta.columnMapping.mode"
TYPE_WIDENING: Final = "delta.enableTypeWidening"
DELETION_VECTORS: Final = "delta.enableDeletionVectors"
# A writer feature (readers that lack it read the table as it is): each commit also records
# its row-level changes, for Spark's ``table_changes`` and delta-rs's ``load_cdf``.
CHANGE_DATA_FEED: Final = "delta.enableChangeDataFeed"

# A table holding more Parquet than this gains deletion vectors (``auto``): the size above
# which pgsub's MERGEs leave delta-rs for Spark too (apply.delta.writer.local_merge).
DELETION_VECTORS_ABOVE: Final = 256 * 2**20
# A batch that would rewrite more than this many times what it writes with deletion vectors
# makes its table gain them (``auto``): its rows, a vector file, its commit.
REWRITE_FACTOR: Final = 4
# What a batch written with deletion vectors writes beyond its rows: a Parquet footer, a
# vector file, the commit's actions (the table's files it touches, added again with a vector).
VECTOR_OVERHEAD: Final = 4096
# A batch that would rewrite no more than this never makes its table gain deletion vectors
# (``auto``): a table this small costs about a batch's fixed parts to rewrite - a 75-column
# table's one-row Parquet file is 24 KB of footer and page headers, a batch that only deletes
# writes no rows - and ten such rewrites a second stay under the 1 MiB/s floor of the
# chart's write-amplification alert. Its readers are worth more than the bytes.
VECTORS_MIN_REWRITE: Final = 64 * 2**10

# Delta refuses these characters in a column name unless column mapping is on.
_UNSTORABLE: Final = re.compile(r"[ ,;{}()\n\t=]")


class FeatureMode(StrEnum):
    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class TableFeatures:
    """The subscription's choice (config ``table_features``)."""

    column_mapping: FeatureMode = FeatureMode.AUTO
    type_widening: FeatureMode = FeatureMode.AUTO
    deletion_vectors: FeatureMode = FeatureMode.AUTO
    deletion_vectors_above: int = DELETION_VECTORS_ABOVE  # bytes of Parquet (auto)
    change_data_feed: bool = False  # on request: a writer feature, every MERGE by Spark
    rewrite_factor: float = REWRITE_FACTOR  # auto: a batch rewriting more than this times...


PORTABLE: Final = TableFeatures()  # the default: no reader feature the data does not need


class FeatureRefusedError(ApplyError):
    """A table needs a feature the subscription's ``table_features`` says never to use."""


# The readers that refuse a table with each reader feature (docs/tables.md, "Which reader
# opens what", checked by tests/integration/apply/delta/writer/test_own_writer_conformance.py).
EXCLUDED_READERS: Final = {
    "columnMapping": "polars 2.1 (delta-rs 1.6 reads it)",
    "typeWidening": "delta-rs 1.6 (deltalake: every way it reads) and polars 2.1",
    "deletionVectors": "delta-rs 1.6's to_pyarrow_table, to_pyarrow_dataset and to_pandas "
    "(its QueryBuilder and polars 2.1 read it)",
}


@dataclass(frozen=True, slots=True)
class Gain:
    """A reader feature a table takes on, with why."""

    feature: str  # Delta's name: columnMapping, typeWidening
    property: str
    value: str
    reason: str


def excluded_readers(feature: str) -> str:
    """The readers that can no longer open a table with the reader feature ``feature``."""
    return EXCLUDED_READERS.get(feature, "readers that lack it")


def needs_column_mapping(name: str) -> bool:
    return _UNSTORABLE.search(name) is not None


def creation_properties(
    columns: Sequence[str], features: TableFeatures, table: str
) -> tuple[dict[str, str], list[Gain]]:
    """The ``delta.*`` properties a new table of ``columns`` is created with, and the reader
    features among them that its data needs (``auto``), to be logged."""
    needed = gains({}, columns, (), features, table)
    properties = {gain.property: gain.value for gain in needed}
    if features.column_mapping is FeatureMode.ALWAYS:
        properties[COLUMN_MAPPING] = "name"
    if features.type_widening is FeatureMode.ALWAYS:
        properties[TYPE_WIDENING] = "true"
    if features.deletion_vectors is FeatureMode.ALWAYS:
        properties[DELETION_VECTORS] = "true"
    if features.change_data_feed:
        properties[CHANGE_DATA_FEED] = "true"
    return properties, needed


def feed_wanted(properties: Mapping[str, str], features: TableFeatures) -> bool:
    """Whether an existing table (its current ``properties``) must turn its change data feed
    on: asked for, and not on yet. Never turned off by pgsub: the feed may have readers."""
    return features.change_data_feed and properties.get(CHANGE_DATA_FEED) != "true"


def size_gain(properties: Mapping[str, str], size: int, features: TableFeatures) -> Gain | None:
    """Deletion vectors, when an existing table of ``size`` bytes of Parquet (its current
    ``properties``) has grown past ``deletion_vectors_above`` and ``auto`` lets it gain them."""
    if (
        features.deletion_vectors is not FeatureMode.AUTO
        or properties.get(DELETION_VECTORS) == "true"
        or size <= features.deletion_vectors_above
    ):
        return None
    return Gain(
        "deletionVectors",
        DELETION_VECTORS,
        "true",
        f"the table holds {size / 2**20:.0f} MiB of Parquet, above "
        f"table_features.deletion_vectors_above ({features.deletion_vectors_above / 2**20:.0f}"
        " MiB): a MERGE of scattered keys now writes the changed rows and a bitmap per file"
        " it touches, instead of rewriting every such file",
    )


def write_gain(
    properties: Mapping[str, str], rewrite: int, rows: int, row_bytes: int, features: TableFeatures
) -> Gain | None:
    """Deletion vectors, when a batch of ``rows`` rows of about ``row_bytes`` bytes each (in
    Parquet) would rewrite ``rewrite`` bytes of the table's files without them, more than
    ``rewrite_factor`` times what it writes with them and more than ``VECTORS_MIN_REWRITE``,
    and ``auto`` lets it gain them."""
    if (
        features.deletion_vectors is not FeatureMode.AUTO
        or properties.get(DELETION_VECTORS) == "true"
        or rewrite <= VECTORS_MIN_REWRITE
    ):
        return None
    with_vectors = rows * row_bytes + VECTOR_OVERHEAD
    if rewrite <= features.rewrite_factor * with_vectors:
        return None
    return Gain(
        "deletionVectors",
        DELETION_VECTORS,
        "true",
        f"a batch of {rows} rows would rewrite {rewrite / 2**10:.0f} KiB of the table's files, "
        f"{rewrite / with_vectors:.0f} times the {with_vectors / 2**10:.0f} KiB it writes with "
        f"deletion vectors (table_features.rewrite_factor: {features.rewrite_factor:g}): its "
        "batches now write their rows and a bitmap per file they touch",
    )


def gains(
    properties: Mapping[str, str],
    added: Sequence[str],
    widened: Sequence[str],
    features: TableFeatures,
    table: str,
) -> list[Gain]:
    """The reader features an existing table must take on before adding ``added`` columns
    and widening ``widened`` ones (``properties``: the table's current ones)."""
    found: list[Gain] = []
    mapping = _column_mapping(added, features, table, properties)
    if mapping is not None:
        found.append(mapping)
    if widened and properties.get(TYPE_WIDENING) != "true":
        if features.type_widening is FeatureMode.NEVER:
            raise FeatureRefusedError(
                f"column {widened[0]!r} of {table} widened its type on the publisher, and "
                "widening a Delta column in place needs the typeWidening reader feature, "
                "which table_features.type_widening says never to use; set it to auto, or "
                "resync the table (`pgsub resync`) after moving the old Delta table away"
            )
        found.append(
            Gain("typeWidening", TYPE_WIDENING, "true", f"column {widened[0]!r} widened its type")
        )
    return found


def _column_mapping(
    columns: Sequence[str],
    features: TableFeatures,
    table: str,
    properties: Mapping[str, str],
) -> Gain | None:
    if properties.get(COLUMN_MAPPING, "none") != "none":
        return None
    unstorable = [name for name in columns if needs_column_mapping(name)]
    if not unstorable:
        return None
    if features.column_mapping is FeatureMode.NEVER:
        raise FeatureRefusedError(
            f"column {unstorable[0]!r} of {table} has a name Delta stores only with column "
            "mapping (it holds a space or one of ,;{}()= or a tab or newline), which "
            "table_features.column_mapping says never to use; set it to auto, or rename the "
            "column on the publisher"
        )
    return Gain("columnMapping", COLUMN_MAPPING, "name", f"column name {unstorable[0]!r} needs it")
