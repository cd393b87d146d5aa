"""Transactions too large for memory, held in local files until they are applied.

Two kinds of transaction end up here (docs/apply.md, "Large transactions"):

- with ``streaming = on`` the publisher sends a large transaction in blocks
  while it is still running, interleaved with other transactions, and says
  at the end whether it committed or aborted;
- a transaction sent whole that holds more changes than a batch may
  (``batch.max_changes``) is moved here once it grows past that bound.

Each gets one file under the spool directory. Changes are appended in
frames, each a length and then either

- a run of one relation's changes as the decoder read them, a column at a
  time (``apply.columns.change_columns``): one Arrow IPC stream, LZ4-compressed;
  nearly every change of a large transaction comes this way, and its net
  effect is computed from the columns without a Python step per change
  (``SpooledTransaction.frames``, ``apply.batching.columns_net``);
- or up to ``FRAME`` other changes pickled as plain tuples, with the
  Relations they were read with (``apply.arrival.spool_frames``),

so memory stays bounded by one frame whatever the transaction's size.

A subtransaction abort truncates the file back to where that
subtransaction's first change was written and forgets the subtransactions
that began after it, as PostgreSQL's apply worker does with its subxact
offsets; a Stream Abort of the top transaction deletes the
file. A committed transaction is read back a piece at a time by the apply
worker (``SpooledTransaction.pieces``), which deletes the file once applied.

Files are scratch: the publisher sends every transaction not yet confirmed
again after a reconnect or restart, so nothing here has to survive a crash,
and a spool directory is emptied when its pipeline starts. The directory is
private to the process (0700) and pickled frames are read back by an
unpickler that refuses to look up any class or function: a frame can only
hold tuples, bytes, strings, numbers and None (an Arrow frame holds data
only).
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, cast

import pyarrow as pa

from apply.arrival.spool_frames import FRAME, SpoolError, decode_pickled, encode_frame
from apply.arrival.spooled_piece import SpooledPiece
from apply.columns.change_columns import ChangeColumns
from apply.core import folders
from apply.core.transactions import (
    Bounds,
    Change,
    RemoteTransaction,
    RowChange,
    change_size,
)
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation

if TYPE_CHECKING:
    from apply.arrival.prestage import Prestage, Prestager

_LENGTH: Final = struct.Struct("!I")
# LZ4: a 1M-row UPDATE's columns spool as 23 MB instead of 76, for little CPU.
_IPC: Final = pa.ipc.IpcWriteOptions(compression="lz4")
_ARROW: Final = b"\xff"  # an Arrow IPC stream's first byte (a pickle's is 0x80)


@dataclass
class _Subxact:
    offset: int  # file size before its first change
    changes: int  # changes before its first change
    relations: int  # Relation messages seen before it


@dataclass
class Spool:
    """One transaction's file while it is being received."""

    xid: int
    path: Path
    changes: int = 0
    _size: int = 0
    _pending: list[Change] = field(default_factory=list)
    _subxacts: dict[int, _Subxact] = field(default_factory=dict)
    _order: list[int] = field(default_factory=list)
    _relations: list[Relation] = field(default_factory=list)
    _file: BinaryIO | None = None
    # The transaction staged while it arrives (``apply.arrival.prestage``): told of each frame.
    prestage: Prestage | None = None

    @property
    def size(self) -> int:
        """Bytes written to the file so far."""
        return self._size

    @property
    def relations(self) -> list[Relation]:
        """The Relation messages received in this transaction, in order (not aborted ones)."""
        return list(self._relations)

    def relation(self, oid: int) -> Relation | None:
        """The latest Relation this transaction sent for ``oid``."""
        for relation in reversed(self._relations):
            if relation.oid == oid:
                return relation
        return None

    def note_relation(self, relation: Relation, subxid: int | None = None) -> None:
        self._enter(subxid)
        self._relations.append(relation)

    def append(self, change: Change, subxid: int | None = None) -> None:
        self._enter(subxid)
        self._pending.append(change)
        self.changes += 1
        if len(self._pending) >= FRAME:
            self.flush()

    def _enter(self, subxid: int | None) -> None:
        if subxid is None or subxid == self.xid or subxid in self._subxacts:
            return
        self.flush()
        self._subxacts[subxid] = _Subxact(self._size, self.changes, len(self._relations))
        self._order.append(subxid)

    def append_columns(self, changes: ChangeColumns, subxid: int | None = None) -> None:
        """Changes of one relation as one frame of columns (an Arrow IPC stream), after the
        changes pending before them."""
        self._enter(subxid)
        self.flush()
        batch = changes.record_batch()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=_IPC) as writer:
            writer.write_batch(batch)
        self._write(sink.getvalue())
        self.changes += changes.rows
        if self.prestage is not None:
            self.prestage.columns(changes)

    def append_held(self, changes: list[Change]) -> None:
        """What a transaction held in memory, spooled as what followed it will be: each run
        of one relation's row changes as columns, so that its pieces are staged from
        columns too (``apply.batching.columns_net``); anything else as it is."""
        start = 0
        while start < len(changes):
            first = changes[start]
            end = start + 1
            relation = first.relation if isinstance(first, RowChange) else None
            if relation is not None and relation.columns:
                while end < len(changes):
                    following = changes[end]
                    if not isinstance(following, RowChange) or following.relation is not relation:
                        break
                    end += 1
                run = cast(list[RowChange], changes[start:end])
                self.append_columns(ChangeColumns.of(relation, run))
            else:
                self.append(first)
            start = end

    def flush(self) -> None:
        if not self._pending:
            return
        frame = pickle.dumps(encode_frame(self._pending), protocol=pickle.HIGHEST_PROTOCOL)
        self._pending = []
        self._write(frame)
        if self.prestage is not None:
            self.prestage.rows()

    def _write(self, frame: bytes | pa.Buffer) -> None:
        length = len(frame) if isinstance(frame, bytes) else frame.size
        try:
            if self._file is None:
                self._file = self.path.open("ab")
            self._file.write(_LENGTH.pack(length))
            self._file.write(frame)
        except OSError as exc:
            raise SpoolError(f"cannot write the spool file {self.path}: {exc}") from exc
        self._size += _LENGTH.size + length

    def close(self) -> None:
        """End of a streamed block: everything on disk, no file handle kept."""
        self.flush()
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                raise SpoolError(f"cannot write the spool file {self.path}: {exc}") from exc
            self._file = None

    def abort_subxact(self, subxid: int) -> None:
        """Drop the changes of ``subxid`` and of every subtransaction that began after it."""
        sub = self._subxacts.get(subxid)
        if sub is None:
            return  # nothing of it was streamed
        if self.prestage is not None:
            self.prestage.abandon("a subtransaction rolled back")
        self.close()
        try:
            os.truncate(self.path, sub.offset)
        except OSError as exc:
            raise SpoolError(f"cannot truncate the spool file {self.path}: {exc}") from exc
        self._size = sub.offset
        self.changes = sub.changes
        del self._relations[sub.relations :]
        at = self._order.index(subxid)
        for later in self._order[at:]:
            del self._subxacts[later]
        del self._order[at:]

    def discard(self) -> None:
        self._pending = []
        if self.prestage is not None:
            self.prestage.discard()
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)


def read_frames(path: Path) -> Iterator[list[Change] | ChangeColumns]:
    """The frames of a spool file, in order, one in memory at a time: pickled changes, or
    one relation's changes as columns."""
    known: dict[tuple[Any, ...], Relation] = {}
    try:
        with path.open("rb") as file:
            while header := file.read(_LENGTH.size):
                if len(header) < _LENGTH.size:
                    raise SpoolError(f"spool file {path} ends inside a frame header")
                (length,) = _LENGTH.unpack(header)
                frame = file.read(length)
                if len(frame) < length:
                    raise SpoolError(f"spool file {path} ends inside a frame")
                yield _decoded(frame, known, path)
    except OSError as exc:
        raise SpoolError(f"cannot read the spool file {path}: {exc}") from exc


def _decoded(
    frame: bytes, known: dict[tuple[Any, ...], Relation], path: Path
) -> list[Change] | ChangeColumns:
    try:
        if frame[:1] == _ARROW:
            return ChangeColumns.from_record_batch(
                pa.ipc.open_stream(pa.py_buffer(frame)).read_next_batch(), known
            )
        return decode_pickled(frame, known)
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise SpoolError(f"spool file {path} holds a damaged frame: {exc}") from exc


def read_changes(path: Path) -> Iterator[Change]:
    """The changes of a spool file, in order, one frame in memory at a time."""
    for frame in read_frames(path):
        yield from frame.row_changes() if isinstance(frame, ChangeColumns) else frame


@dataclass(frozen=True, slots=True)
class SpooledTransaction:
    """A committed transaction whose changes are in a spool file, not in memory."""

    head: RemoteTransaction  # xid, LSNs, commit time, origin; no changes
    path: Path
    change_count: int
    _release: Callable[[Path], None] = lambda path: path.unlink(missing_ok=True)
    prestage: Prestage | None = None  # staged while it arrived (``apply.arrival.prestage``)

    @property
    def xid(self) -> int:
        return self.head.xid

    @property
    def final_lsn(self) -> Lsn:
        return self.head.final_lsn

    @property
    def end_lsn(self) -> Lsn:
        return self.head.end_lsn

    @property
    def commit_time(self) -> int:
        return self.head.commit_time

    def pieces(self, bounds: Bounds) -> Iterator[RemoteTransaction]:
        """The transaction as consecutive pieces within ``bounds`` (one change at least).

        Each piece is a RemoteTransaction with the transaction's xid and
        LSNs and ``first`` set to the position of its first change in the
        whole transaction (what a partly applied table resumes from).
        """
        buffer: list[Change] = []
        size = 0
        first, total = 0, self.change_count
        for change in read_changes(self.path):
            buffer.append(change)
            size += change_size(change)
            if bounds.reached(len(buffer), size) and first + len(buffer) < total:
                yield replace(self.head, changes=tuple(buffer), first=first, total=total, size=size)
                first += len(buffer)
                buffer, size = [], 0
        if first + len(buffer) != self.change_count:
            raise SpoolError(
                f"spool file {self.path} holds {first + len(buffer)} changes of transaction "
                f"{self.xid}, expected {self.change_count}"
            )
        yield replace(self.head, changes=tuple(buffer), first=first, total=total, size=size)

    def frames(self, bounds: Bounds) -> Iterator[SpooledPiece]:
        """The transaction as consecutive pieces of whole frames, each within ``bounds`` but
        for its last frame: row changes as they were spooled, and one relation's changes as
        columns (``apply.columns.change_columns``), for a net effect computed a column at a time."""
        frames: list[list[Change] | ChangeColumns] = []
        first = count = size = 0
        for frame in read_frames(self.path):
            frames.append(frame)
            if isinstance(frame, ChangeColumns):
                count, size = count + frame.rows, size + frame.size
            else:
                count, size = count + len(frame), size + sum(map(change_size, frame))
            if bounds.reached(count, size) and first + count < self.change_count:
                yield SpooledPiece(self.head, tuple(frames), first, count)
                first += count
                frames, count, size = [], 0, 0
        if first + count != self.change_count:
            raise SpoolError(
                f"spool file {self.path} holds {first + count} changes of transaction "
                f"{self.xid}, expected {self.change_count}"
            )
        yield SpooledPiece(self.head, tuple(frames), first, count)

    def discard(self) -> None:
        if self.prestage is not None:
            self.prestage.discard()
        self._release(self.path)


def private_directory(path: Path) -> Path:
    """``path`` as a spool directory only this user can enter (spool files hold row data),
    made if missing."""
    return folders.private_directory(
        path,
        what="the spool directory",
        remedy="set spool_dir to a directory of this user's",
        error=SpoolError,
    )


class SpoolDirectory:
    """The spool files of one pipeline, and how many bytes they hold."""

    def __init__(
        self,
        root: Path,
        on_size: Callable[[int], None] | None = None,
        prestager: Prestager | None = None,
    ) -> None:
        self.root = root
        self._on_size = on_size
        self.prestager = prestager  # stages what the assembler spools while it arrives
        self._lock = threading.Lock()
        self._sizes: dict[Path, int] = {}
        shutil.rmtree(root, ignore_errors=True)  # what an earlier run left is sent again
        private_directory(root)

    def open(self, name: str, xid: int, *, prestaged: bool = False) -> Spool:
        """A new spool file; ``prestaged``: its transaction is staged while it arrives, where
        this directory has a prestager."""
        path = self.root / name
        path.unlink(missing_ok=True)
        prestager = self.prestager if prestaged else None
        return Spool(xid, path, prestage=None if prestager is None else prestager.open(xid))

    def track(self, spool: Spool) -> None:
        """Account for what ``spool`` holds on disk now."""
        self._set(spool.path, spool.size)

    def release(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self._set(path, None)

    def discard(self, spool: Spool) -> None:
        spool.discard()
        self._set(spool.path, None)

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def _set(self, path: Path, size: int | None) -> None:
        with self._lock:
            if size is None:
                self._sizes.pop(path, None)
            else:
                self._sizes[path] = size
            total = sum(self._sizes.values())
        if self._on_size is not None:
            self._on_size(total)
