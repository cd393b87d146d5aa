"""A spool file's pickled frames: changes as plain tuples, read back by an unpickler that
builds nothing else.

Changes that do not come as one relation's columns (``apply.columns.change_columns``)
are spooled ``FRAME`` at a time, pickled as plain tuples with the Relations
they were read with listed once (plain tuples because pickling them runs in
C, where a dataclass goes through Python-level state functions per object).
A prepared transaction is staged in the state store as the same frames
(``frames_of``, ``changes_of``).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Iterator
from typing import Any, Final

from apply.columns.change_columns import relation_of, relation_values
from apply.core.errors import ApplyError
from apply.core.transactions import (
    Change,
    MessageChange,
    Op,
    RowChange,
    TruncateChange,
)
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation, TupleData

FRAME: Final = 2_000  # changes per pickled frame

_OPS: Final = (Op.INSERT, Op.UPDATE, Op.DELETE)
_OP_CODES: Final = {op: code for code, op in enumerate(_OPS)}
_TRUNCATE: Final = len(_OPS)
_MESSAGE: Final = _TRUNCATE + 1

Frame = tuple[tuple[Any, ...], list[tuple[Any, ...]]]


class SpoolError(ApplyError):
    """A spool file cannot be written or read back."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise SpoolError(f"spool frame names {module}.{name}; frames hold plain values only")


def encode_frame(changes: list[Change]) -> Frame:
    """Changes as plain tuples, their Relations listed once."""
    relations: list[tuple[Any, ...]] = []
    index: dict[int, int] = {}

    def ref(relation: Relation) -> int:
        at = index.get(id(relation))
        if at is None:
            at = index[id(relation)] = len(relations)
            relations.append(relation_values(relation))
        return at

    rows: list[tuple[Any, ...]] = []
    for change in changes:
        if isinstance(change, RowChange):
            new, old = change.new, change.old
            rows.append(
                (
                    _OP_CODES[change.op],
                    ref(change.relation),
                    None if new is None else new.kinds,
                    None if new is None else new.values,
                    None if old is None else old.kinds,
                    None if old is None else old.values,
                )
            )
        elif isinstance(change, MessageChange):
            message = (int(change.lsn), change.transactional, change.prefix, change.content)
            rows.append((_MESSAGE, *message))
        else:
            oids = tuple(ref(r) for r in change.relations)
            rows.append((_TRUNCATE, oids, change.cascade, change.restart_identity))
    return tuple(relations), rows


def decode_frame(frame: Frame, known: dict[tuple[Any, ...], Relation]) -> list[Change]:
    """The changes of a frame; ``known`` keeps one Relation object per description."""
    values, rows = frame
    relations = [relation_of(value, known) for value in values]
    changes: list[Change] = []
    for row in rows:
        if row[0] == _MESSAGE:
            _, lsn, transactional, prefix, content = row
            changes.append(MessageChange(Lsn(lsn), transactional, prefix, content))
            continue
        if row[0] == _TRUNCATE:
            _, refs, cascade, restart = row
            changes.append(TruncateChange(tuple(relations[r] for r in refs), cascade, restart))
            continue
        code, ref, new_kinds, new_values, old_kinds, old_values = row
        changes.append(
            RowChange(
                relations[ref],
                _OPS[code],
                None if new_kinds is None else TupleData(new_kinds, new_values),
                None if old_kinds is None else TupleData(old_kinds, old_values),
            )
        )
    return changes


def frames_of(changes: Iterable[Change]) -> Iterator[bytes]:
    """``changes`` as pickled frames of ``FRAME`` changes (what a spool file holds, without
    the length headers): how a prepared transaction is staged in the state store."""
    pending: list[Change] = []
    for change in changes:
        pending.append(change)
        if len(pending) >= FRAME:
            yield pickle.dumps(encode_frame(pending), protocol=pickle.HIGHEST_PROTOCOL)
            pending = []
    if pending:
        yield pickle.dumps(encode_frame(pending), protocol=pickle.HIGHEST_PROTOCOL)


def decode_pickled(frame: bytes, known: dict[tuple[Any, ...], Relation]) -> list[Change]:
    """The changes of one pickled frame (``pickle.UnpicklingError`` and the like when it is
    damaged: the caller names where it came from)."""
    return decode_frame(_Unpickler(io.BytesIO(frame)).load(), known)


def changes_of(frames: Iterable[bytes]) -> Iterator[Change]:
    """The changes of frames made by ``frames_of``, read as spool files are (plain values)."""
    known: dict[tuple[Any, ...], Relation] = {}
    for frame in frames:
        try:
            yield from decode_pickled(frame, known)
        except (pickle.UnpicklingError, ValueError, TypeError, IndexError) as exc:
            raise SpoolError(f"a staged frame is damaged: {exc}") from exc
