"""A large transaction's net effect on one table, staged as Parquet a piece at a time.

A transaction larger than a batch is read back from its spool a piece at a
time (memory stays bounded) and each piece's net effect is collapsed as
any batch's. Instead of one MERGE per piece - each rewriting the files it
touches, and each visible to readers on its own - the pieces' MERGE sources
are written here as Parquet files, and the transaction lands in one MERGE
per table that reads them all (``apply.delta.tables.DeltaTables.write_staged``).

That is only the same as applying the pieces one after the other when no
key has a chain in two pieces: the staged keys are counted against their
distinct count, here in Arrow while they fit ``KEYS_HELD`` bytes, else by
the writer over the staged files (in Spark, so that Python's memory does
not grow with the transaction), and the caller falls back to the pieces
otherwise. ``add`` refuses what the one-MERGE path does not handle (a
TRUNCATE in the transaction, unchanged TOAST values that moved with a key
change).

What the MERGE needs besides the rows is accumulated on the way: the keep
columns, which clauses some row can take (``Shape``), the key bounds, and
the counts a conflict-free MERGE reports (``expected_counts``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from apply.batching.collapse import KeyedNet
from apply.batching.source import (
    FIRST,
    PRESENT,
    REINSERTED,
    TX,
    KeyedSource,
    keep_flag,
    keyed_source,
)
from apply.columns.schema import TargetSchema
from apply.plans.merge_plan import Shape, expected_counts, key_bounds, shape_of

KEYS_HELD: Final = 256 << 20  # bytes of staged keys held in memory for their check


@dataclass
class StagedSource:
    directory: Path
    schema: TargetSchema
    pieces: int = 0
    rows: int = 0
    keep: set[int] = field(default_factory=set)
    shape: Shape = field(default_factory=lambda: Shape(False, False, False, False))
    expected: tuple[int, int, int] = (0, 0, 0)  # inserted, updated, deleted
    bounds: tuple[int, int] | None = None
    # Each piece's keys while they fit ``KEYS_HELD`` bytes (None past it): whether a key has
    # rows in two pieces is then known here, without a Spark job over the staged files.
    keys: list[pa.Table] | None = field(default_factory=list)
    key_bytes: int = 0
    bytes: int = 0  # of the staged Parquet files
    # Each piece's smallest and largest (integer) first key column, None: not known.
    ranges: list[tuple[int, int] | None] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        """The staged files' columns: the table's, then the MERGE's helper columns."""
        flags = [keep_flag(i) for i in range(len(self.schema.columns))]
        return [*(c.name for c in self.schema.columns), FIRST, PRESENT, REINSERTED, TX, *flags]

    def add(self, net: KeyedNet) -> bool:
        """Stage one piece's net effect; False when the one-MERGE path cannot take it."""
        return not net.truncated and self.add_source(keyed_source(net, self.schema))

    def add_source(self, source: KeyedSource) -> bool:
        """Stage one piece's MERGE source (``apply.batching.source``, or
        ``apply.batching.columns_net``); False
        when the one-MERGE path cannot take it."""
        if source.moved:
            return False
        table = source.table
        for index in range(len(self.schema.columns)):
            flag = keep_flag(index)
            if flag not in table.column_names:
                table = table.append_column(flag, pa.array([False] * table.num_rows))
        table = table.select(self.columns)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        piece = self.directory / f"piece-{self.pieces:06d}.parquet"
        pq.write_table(table, piece)
        self.bytes += piece.stat().st_size
        self.pieces += 1
        self.rows += table.num_rows
        self.keep.update(source.keep_columns)
        shape = shape_of(source.table)
        self.shape = Shape(
            self.shape.expects_absent or shape.expects_absent,
            self.shape.inserts or shape.inserts,
            self.shape.updates or shape.updates,
            self.shape.deletes or shape.deletes,
        )
        self.expected = tuple(  # type: ignore[assignment]
            a + b for a, b in zip(self.expected, expected_counts(table), strict=True)
        )
        bounds = key_bounds(table, self.schema.key[0])
        self._widen_bounds(bounds)
        self.ranges.append(bounds)
        self._hold_keys(table.select(list(self.schema.key)))
        return True

    def _hold_keys(self, keys: pa.Table) -> None:
        if self.keys is None:
            return
        self.key_bytes += keys.nbytes
        if self.key_bytes > KEYS_HELD:
            self.keys = None
        else:
            self.keys.append(keys)

    def read(self) -> pa.Table:
        """Every staged row, in one table (read whole: mind ``bytes``)."""
        files = sorted(self.directory.glob("piece-*.parquet"))
        return pa.concat_tables([pq.read_table(file) for file in files])

    def reader(self, schema: pa.Schema) -> pa.RecordBatchReader:
        """The staged rows' ``schema`` columns, a batch at a time."""
        import pyarrow.dataset as ds

        files = [str(f) for f in sorted(self.directory.glob("piece-*.parquet"))]
        scanner = ds.dataset(files, format="parquet").scanner(
            columns=schema.names, batch_readahead=1, fragment_readahead=1
        )
        batches = (batch.cast(schema) for batch in scanner.to_batches())
        return pa.RecordBatchReader.from_batches(schema, batches)

    def keys_unique(self) -> bool | None:
        """Whether no key has rows in two staged pieces; None when the keys were too many to
        hold (ask the staged files: ``Tables.staged_keys_unique``)."""
        if self._apart():
            return True
        if self.keys is None:
            return None
        held = pa.concat_tables(self.keys)
        distinct = held.group_by(list(self.schema.key), use_threads=False).aggregate([])
        return bool(distinct.num_rows == held.num_rows)

    def _apart(self) -> bool:
        """Whether the pieces' key ranges do not meet (a transaction that wrote its rows in
        key order): then no key is in two pieces, known without hashing them."""
        if any(bounds is None for bounds in self.ranges):
            return False
        ordered = sorted(bounds for bounds in self.ranges if bounds is not None)
        return all(high < low for (_, high), (low, _) in pairwise(ordered))

    def _widen_bounds(self, bounds: tuple[int, int] | None) -> None:
        if bounds is None:
            return
        if self.bounds is None:
            self.bounds = bounds
        else:
            self.bounds = (min(self.bounds[0], bounds[0]), max(self.bounds[1], bounds[1]))
