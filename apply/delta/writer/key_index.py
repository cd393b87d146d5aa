"""The key index of pgsub's deletion-vector write (``apply.delta.writer.vector_write``).

For each live file of a big table, the key of each of its rows, and which
rows are alive (its deletion vector): a batch's rows are found in memory,
without reading the table. Files never change, so what the index keeps is
true as long as the log says the file is live; it reads a file only when
the file is new to it, and a vector only when another writer changed it.

Integer keys are kept sorted and found by binary search; any other key by
an Arrow set lookup. A key of several columns is kept as one string a row,
the columns' text forms joined by NUL (``KeyIndex.key_of``). The price is
memory: the key's width plus five bytes a row (docs/operations.md, "Scale").
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from apply.delta.files.store import TableStore
from apply.delta.writer import deletion_vectors
from apply.delta.writer.kept_rows import KEPT
from apply.delta.writer.live_files import VectorFile

Alive = npt.NDArray[np.bool_]

# Threads reading a table's files into its key index at its first batch (Parquet reads and
# NumPy's sort let go of the GIL): 20M keys in 2 files, 0.41 s in one thread, 0.19 s in two.
READERS: Final = min(4, os.cpu_count() or 1)
# A composite key's columns as text, joined by NUL: no PostgreSQL text value holds one, so
# two joined keys are equal exactly when their columns are.
_JOIN: Final = "\x00"


def lookup_keys(types: pa.Schema, keys: tuple[str, ...]) -> pa.Schema | None:
    """The key columns of a table whose columns have ``types``, if ``KeyIndex`` can look them
    up: any one column; several whose text forms are equal exactly when their values are
    (integers, text, dates, timestamps, decimals, booleans: not floats, whose -0 and 0 are
    equal, nor bytes, which may hold a NUL)."""
    fields = pa.schema([types.field(name) for name in keys])
    if len(fields) == 1 or all(_joinable(field.type) for field in fields):
        return fields
    return None


def _joinable(type_: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(type_)
        or pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_date(type_)
        or pa.types.is_timestamp(type_)
        or pa.types.is_decimal(type_)
        or pa.types.is_boolean(type_)
    )


@dataclass(slots=True)
class _Keys:
    """One live file's keys, and which of its rows are alive as of ``vector``. Integer keys
    are kept sorted, with each one's row (a batch's keys found by binary search, without
    reading every key); other keys as the file holds them (found by a set lookup)."""

    rows: int
    alive: Alive
    vector: str | None  # the vector's unique id the mask reflects
    keys: pa.Array | None = None  # a key that is not an integer
    ordered: npt.NDArray[np.generic] | None = None  # integer keys, sorted
    order: npt.NDArray[np.int32] | None = None  # the row of each of ``ordered``

    @classmethod
    def of(cls, column: pa.Array) -> _Keys:
        alive = np.ones(len(column), dtype=np.bool_)
        if pa.types.is_integer(column.type) and column.null_count == 0:
            values = column.to_numpy()
            order = np.argsort(values, kind="stable").astype(np.int32)
            return cls(len(column), alive, None, ordered=values[order], order=order)
        return cls(len(column), alive, None, keys=column)

    def find(self, wanted: pa.Array, numbers: npt.NDArray[np.generic] | None) -> _Found:
        """The rows holding a key of ``wanted`` (``numbers``: the same, integer keys)."""
        if self.ordered is not None and self.order is not None and numbers is not None:
            low = np.searchsorted(self.ordered, numbers, side="left")
            counts = np.searchsorted(self.ordered, numbers, side="right") - low
            if not counts.any():  # most of a table's files hold none of a small batch's keys
                return _Found(_NO_ROWS, _no_keys(self.ordered.dtype))
            starts = np.repeat(low, counts)
            steps = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            at = starts + steps
            return _Found(self.order[at].astype(np.int64), pa.array(self.ordered[at]))
        assert self.keys is not None
        hits = pc.is_in(self.keys, value_set=wanted).to_numpy(zero_copy_only=False)
        positions = np.flatnonzero(hits)
        return _Found(positions, self.keys.take(pa.array(positions)))


_NO_ROWS: Final = np.empty(0, dtype=np.int64)


@functools.cache
def _no_keys(dtype: np.dtype[np.generic]) -> pa.Array:
    return pa.array([], type=pa.from_numpy_dtype(dtype))


@dataclass(frozen=True, slots=True)
class _Found:
    positions: npt.NDArray[np.int64]
    keys: pa.Array


@dataclass(frozen=True, slots=True)
class Match:
    file: VectorFile
    positions: npt.NDArray[np.int64]  # the alive rows holding a key of the batch


class KeyIndex:
    """The key of each row of each live file of a table, and which of its rows are alive.
    ``keys``: the key columns (``lookup_keys``)."""

    def __init__(self, store: TableStore, keys: pa.Schema) -> None:
        self.store = store
        self.keys = keys
        self.key_type = keys.field(0).type if len(keys) == 1 else pa.string()
        self._files: dict[str, _Keys] = {}

    def key_of(self, rows: pa.Table) -> pa.Array:
        """Each row's key: its key column, or its key columns' text forms joined by NUL."""
        columns = [rows[field.name].combine_chunks().cast(field.type) for field in self.keys]
        if len(columns) == 1:
            return columns[0]
        texts = [column.cast(pa.string()) for column in columns]
        joined: pa.Array = pc.binary_join_element_wise(*texts, _JOIN)
        return joined

    def refresh(self, files: list[VectorFile]) -> None:
        """Brought to the live ``files``: new files read, changed vectors read anew."""
        live = {file.name: file for file in files}
        for gone in set(self._files) - set(live):
            del self._files[gone]
        new = [file for name, file in live.items() if name not in self._files]
        if len(new) > 1:  # a table's first batch: its files read and sorted side by side
            with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="keys") as pool:
                read = pool.map(self._read, new)
                self._files.update(zip([f.name for f in new], read, strict=True))
        for name, file in live.items():
            known = self._files.get(name)
            unique = None if file.vector is None else file.vector.unique_id
            if known is None:
                known = self._files[name] = self._read(file)
            if known.vector != unique:
                known.alive = np.ones(known.rows, dtype=np.bool_)
                if file.vector is not None:
                    deleted = deletion_vectors.read(self.store, file.vector)
                    known.alive[deleted.astype(np.int64)] = False
                known.vector = unique

    def _read(self, file: VectorFile) -> _Keys:
        """The file's keys, every row alive (its vector is read by ``refresh``); from the rows
        kept of a file this process wrote (``kept_rows``), else read from the file."""
        keys = KEPT.get(self.store.location, file.name)
        if keys is None:
            keys = pq.ParquetFile(self.store.open(file.name, file.size)).read(
                columns=self.keys.names
            )
        return _Keys.of(self.key_of(keys))

    def find(self, files: list[VectorFile], wanted: pa.Array) -> tuple[list[Match], pa.Array]:
        """The alive rows whose key is in ``wanted``, by file, and their keys."""
        # Sorted, the batch's keys are looked up in order: each search starts where the one
        # before ended, in memory just read - 8 ms for 100,000 keys in a file of 1M, where
        # as they came (random places of the file) took 72.
        numbers = np.sort(wanted.to_numpy()) if pa.types.is_integer(wanted.type) else None
        matches, found = [], []
        for file in files:
            known = self._files[file.name]
            hits = known.find(wanted, numbers)
            alive = known.alive[hits.positions]
            positions = hits.positions[alive]
            if positions.size:
                order = np.argsort(positions)
                matches.append(Match(file, positions[order]))
                found.append(hits.keys.filter(pa.array(alive)).take(pa.array(order)))
        if not found:
            return [], pa.array([], type=self.key_type)
        return matches, pa.concat_arrays([k.cast(self.key_type) for k in found])

    def deleted(self, name: str, positions: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """Every row of the file ``name`` deleted once ``positions`` are."""
        return np.flatnonzero(~self.alive_after(name, positions)).astype(np.uint64)

    def alive_after(self, name: str, positions: npt.NDArray[np.int64] | None) -> Alive:
        """Which rows of the file ``name`` are alive once ``positions`` are deleted."""
        alive = self._files[name].alive.copy()
        if positions is not None:
            alive[positions] = False
        return alive

    def rows(self, name: str) -> int:
        """The rows the file ``name`` holds, deleted ones too."""
        return self._files[name].rows

    def committed(self, name: str, positions: npt.NDArray[np.int64], vector: str) -> None:
        known = self._files[name]
        known.alive[positions] = False
        known.vector = vector

    def added(self, name: str, rows: pa.Table) -> None:
        """The file at ``path``, just written with ``rows``."""
        self._files[name] = _Keys.of(self.key_of(rows))
