"""Row changes of one relation as columns: how a large transaction is spooled and read back.

The decoder reads a run of Insert/Update/Delete messages of one relation a
column at a time (``subscriber.replication.tuples.WalkedChanges``). A
transaction that goes to a spool file (``apply.arrival.spool``) keeps that shape:
``ChangeColumns`` holds each change's message type, its new and old
images' kinds as a rows x columns byte matrix, and one Arrow binary array
of values per column and image, as the wire had them. It is written as one
Arrow IPC stream (the field's format for columns on disk), read back
without a Python step per change, and its net effect on a keyed table is
computed with Arrow (``apply.batching.columns_net``). Where the row-wise path is
needed, ``row_changes`` gives the ``RowChange`` objects the decoder would
have made.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from apply.core.transactions import Op, RowChange
from subscriber.replication.messages import BINARY, Column, Relation, ReplicaIdentity, TupleData
from subscriber.replication.tuples import DELETE, INSERT, UPDATE, TupleColumns, WalkedChanges

Kinds = npt.NDArray[np.uint8]  # rows x columns; a row of zeros: the change has no such image

_OPS: Final = {INSERT: Op.INSERT, UPDATE: Op.UPDATE, DELETE: Op.DELETE}
_RELATION: Final = b"pgsub.relation"


@dataclass(frozen=True, slots=True)
class ChangeColumns:
    """Consecutive row changes of one relation, a column at a time.

    ``ops`` holds each change's message type byte (``INSERT``, ``UPDATE``,
    ``DELETE``); ``new_kinds[i]`` / ``old_kinds[i]`` the kinds of its images
    (all zero where it has none); ``new_values[c]`` / ``old_values[c]``
    column c's value bytes, null where the image has none, the value is NULL
    or unchanged.
    """

    relation: Relation  # of one column at least: an image without columns has no kinds
    ops: npt.NDArray[np.uint8]
    new_kinds: Kinds
    old_kinds: Kinds
    new_values: tuple[pa.BinaryArray, ...]
    old_values: tuple[pa.BinaryArray, ...]

    @property
    def rows(self) -> int:
        return len(self.ops)

    @property
    def size(self) -> int:
        """The bytes of the values (what ``apply.core.transactions.change_size`` sums)."""
        return sum(
            int(pc.sum(pc.binary_length(column)).as_py() or 0)
            for column in (*self.new_values, *self.old_values)
        )

    @property
    def has_binary(self) -> bool:
        """Whether some value came in binary format (``binary: true``)."""
        return bool((self.new_kinds == BINARY).any() or (self.old_kinds == BINARY).any())

    def operations(self) -> Counter[str]:
        """How many changes of each operation (``pgsub_changes_applied_total``'s ``op``)."""
        counts = np.bincount(self.ops, minlength=256)
        return Counter({op.value: int(counts[code]) for code, op in _OPS.items() if counts[code]})

    @classmethod
    def walked(cls, relation: Relation, walked: WalkedChanges) -> ChangeColumns:
        """The changes the decoder walked, each image spread to one row per change."""
        rows = len(walked.types)
        width = len(relation.columns)
        return cls(
            relation,
            np.frombuffer(walked.types, dtype=np.uint8),
            _spread_kinds(walked.new, walked.new_rows, rows, width),
            _spread_kinds(walked.old, walked.old_rows, rows, width),
            _spread_values(walked.new.values, walked.new_rows, rows),
            _spread_values(walked.old.values, walked.old_rows, rows),
        )

    @classmethod
    def of(cls, relation: Relation, changes: Sequence[RowChange]) -> ChangeColumns:
        """``changes`` (all of ``relation``) as columns, a Python step per change: for what
        was held as rows (and for tests)."""
        width = len(relation.columns)
        codes = {op: code for code, op in _OPS.items()}
        images = ([c.new for c in changes], [c.old for c in changes])
        kinds = [
            np.array(
                [list(i.kinds) if i is not None else [0] * width for i in side], dtype=np.uint8
            ).reshape(len(changes), width)
            for side in images
        ]
        values = [
            tuple(
                pa.array([None if i is None else i.values[c] for i in side], type=pa.binary())
                for c in range(width)
            )
            for side in images
        ]
        ops = np.array([codes[c.op] for c in changes], dtype=np.uint8)
        return cls(relation, ops, kinds[0], kinds[1], values[0], values[1])

    @classmethod
    def joined(cls, parts: Sequence[ChangeColumns]) -> ChangeColumns:
        """Consecutive parts of one relation's changes as one."""
        if len(parts) == 1:
            return parts[0]
        width = len(parts[0].relation.columns)

        def values(side: str, c: int) -> pa.BinaryArray:
            joined: pa.BinaryArray = pa.concat_arrays([getattr(p, side)[c] for p in parts])
            return joined

        return cls(
            parts[0].relation,
            np.concatenate([p.ops for p in parts]),
            np.concatenate([p.new_kinds for p in parts]),
            np.concatenate([p.old_kinds for p in parts]),
            tuple(values("new_values", c) for c in range(width)),
            tuple(values("old_values", c) for c in range(width)),
        )

    def row_changes(self) -> list[RowChange]:
        """The changes as the row-wise path takes them (what the decoder would have made)."""
        new = _images(self.new_kinds, self.new_values)
        old = _images(self.old_kinds, self.old_values)
        relation = self.relation
        ops = [_OPS[code] for code in self.ops.tolist()]
        return [RowChange(relation, *change) for change in zip(ops, new, old, strict=True)]

    def record_batch(self) -> pa.RecordBatch:
        """The changes as one Arrow record batch, the relation in its schema's metadata. A
        side no change has an image of (the old side of inserts and most updates) is left
        out."""
        arrays = {"op": pa.array(self.ops, type=pa.uint8())}
        for side, kinds, values in (
            ("n", self.new_kinds, self.new_values),
            ("o", self.old_kinds, self.old_values),
        ):
            if kinds.any():
                arrays[f"{side}_kinds"] = _kinds_array(kinds, len(self.relation.columns))
                arrays.update({f"{side}{i}": column for i, column in enumerate(values)})
        return pa.RecordBatch.from_pydict(
            arrays, metadata={_RELATION: json.dumps(relation_values(self.relation))}
        )

    @classmethod
    def from_record_batch(
        cls, batch: pa.RecordBatch, known: dict[tuple[Any, ...], Relation]
    ) -> ChangeColumns:
        """What ``record_batch`` made; ``known`` keeps one Relation object per description."""
        metadata = batch.schema.metadata or {}
        described = json.loads(metadata[_RELATION])
        relation = relation_of(described, known)
        width, rows = len(relation.columns), batch.num_rows

        def side(name: str) -> tuple[Kinds, tuple[pa.BinaryArray, ...]]:
            if f"{name}_kinds" not in batch.schema.names:
                nothing = pa.nulls(rows, type=pa.binary())
                return np.zeros((rows, width), dtype=np.uint8), (nothing,) * width
            kinds = _kinds_matrix(batch.column(f"{name}_kinds"), width)
            return kinds, tuple(batch.column(f"{name}{i}") for i in range(width))

        (new_kinds, new_values), (old_kinds, old_values) = side("n"), side("o")
        ops = batch.column("op").to_numpy(zero_copy_only=False).astype(np.uint8, copy=False)
        return cls(relation, ops, new_kinds, old_kinds, new_values, old_values)


def relation_values(relation: Relation) -> tuple[Any, ...]:
    """A Relation as plain values (what a spool frame keeps of it)."""
    columns = tuple((c.name, c.type_oid, c.typmod, c.is_key) for c in relation.columns)
    return (
        relation.oid,
        relation.namespace,
        relation.name,
        relation.replica_identity.value,
        columns,
        relation.xid,
    )


def relation_of(values: Sequence[Any], known: dict[tuple[Any, ...], Relation]) -> Relation:
    """The Relation ``relation_values`` described (JSON's lists read back as tuples), made
    once per description."""
    key = _frozen(values)
    relation = known.get(key)
    if relation is None:
        oid, namespace, name, identity, columns, xid = key
        relation = known[key] = Relation(
            oid,
            namespace,
            name,
            ReplicaIdentity(identity),
            tuple(Column(*c) for c in columns),
            xid,
        )
    return relation


def _frozen(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_frozen(v) if isinstance(v, list | tuple) else v for v in values)


def _spread_kinds(
    images: TupleColumns, rows_with: npt.NDArray[np.int64], rows: int, width: int
) -> Kinds:
    kinds = np.zeros((rows, width), dtype=np.uint8)
    if width and len(rows_with):
        kinds[rows_with] = np.frombuffer(images.kinds, dtype=np.uint8).reshape(-1, width)
    return kinds


def _spread_values(
    columns: tuple[pa.BinaryArray, ...], rows_with: npt.NDArray[np.int64], rows: int
) -> tuple[pa.BinaryArray, ...]:
    if len(rows_with) == rows:
        return columns
    at = np.full(rows, -1, dtype=np.int64)
    at[rows_with] = np.arange(len(rows_with))
    indices = pa.array(at, mask=at < 0)
    return tuple(column.take(indices) for column in columns)


def _kinds_array(kinds: Kinds, width: int) -> pa.FixedSizeBinaryArray:
    data = pa.py_buffer(np.ascontiguousarray(kinds).tobytes())
    array: pa.FixedSizeBinaryArray = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(kinds), [None, data]
    )
    return array


def _kinds_matrix(array: pa.Array, width: int) -> Kinds:
    rows = len(array)
    data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    start = array.offset * width
    return data[start : start + rows * width].reshape(rows, width)


def _images(kinds: Kinds, values: tuple[pa.BinaryArray, ...]) -> list[TupleData | None]:
    width = kinds.shape[1]
    has = cast(list[bool], kinds.any(axis=1).tolist())
    # Fixed-width byte strings: numpy drops trailing NULs, and no kind is NUL.
    kind_rows: list[bytes] = np.ascontiguousarray(kinds).view(f"S{width}").ravel().tolist()
    value_rows = zip(*(column.to_pylist() for column in values), strict=True)
    return [
        TupleData(k, v) if present else None
        for present, k, v in zip(has, kind_rows, value_rows, strict=True)
    ]
