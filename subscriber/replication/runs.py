"""A session's messages decoded in order, consecutive row changes as one run (no I/O).

In a large transaction most messages are Insert, Update or Delete; decoding
them a run at a time lets ``PgOutputDecoder.decode_changes`` read their
values a column at a time. A run is held until the next message that is
not a row change - a transaction's run always ends at its Commit, a
streamed block's at its Stream Stop - or until it reaches ``max_messages``
or ``max_bytes``, so holding it delays nothing that could be applied and
bounds the memory it takes.

A small transaction - a Begin, at most ``WHOLE_AT_MOST`` row changes, a
Commit, nothing else between - is handed on as one ``WholeTransaction`` at
its Commit, where it would otherwise be handed on as three or more
messages: a backlog of single-row transactions is bound by the receiver's
Python per message (docs/performance.md, "Small transactions handed on
whole"). Anything else in it (a Relation, an Origin, a Truncate, a
message, more changes) hands on what was held as the messages it decoded
to, in order, and goes on one message at a time. The caller learns when a
Begin is held (``held``), so that the transaction counts as open from its
Begin, as when the Begin is handed on at once. ``push_all`` takes the frames
one read of the stream brought: a small transaction all among them is read
whole in one step, without holding its Begin (its Python a transaction is
what a backlog of them waits on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from subscriber.replication.direct_reads import CHANGE_TYPES
from subscriber.replication.frozen import quick
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Begin, Commit, Delete, Insert, Message, Update
from subscriber.replication.pgoutput import WALK_AT_LEAST, PgOutputDecoder
from subscriber.replication.tuples import RowChanges

RUN_MESSAGES: Final = 8192
RUN_BYTES: Final = 32 << 20
# The row changes a transaction may hold to be handed on whole.
WHOLE_AT_MOST: Final = 8
_BEGIN: Final = ord("B")
_COMMIT: Final = ord("C")


@quick
@dataclass(frozen=True, slots=True)
class WholeTransaction:
    """A small transaction decoded to its Commit, as one item: its Begin's and Commit's
    fields, flat - the two messages are made only when asked for (``begin``, ``commit``,
    ``messages``), which a backlog of single-row transactions never does (two objects
    less a transaction on the receiver's thread)."""

    xid: int
    final_lsn: Lsn  # the Begin's, which is the Commit's commit LSN
    begin_time: int  # the Begin's commit time
    flags: int  # the Commit's
    end_lsn: Lsn
    commit_time: int  # the Commit's
    changes: tuple[Insert | Update | Delete, ...]

    @classmethod
    def of(
        cls, begin: Begin, changes: tuple[Insert | Update | Delete, ...], commit: Commit
    ) -> WholeTransaction:
        """The transaction ``begin``, ``changes``, ``commit`` (whose commit LSN is the
        Begin's final LSN)."""
        return cls(
            begin.xid,
            begin.final_lsn,
            begin.commit_time,
            commit.flags,
            commit.end_lsn,
            commit.commit_time,
            changes,
        )

    @property
    def begin(self) -> Begin:
        return Begin(self.final_lsn, self.begin_time, self.xid)

    @property
    def commit(self) -> Commit:
        return Commit(self.flags, self.final_lsn, self.end_lsn, self.commit_time)

    def messages(self) -> list[Message]:
        """The messages it was, in stream order."""
        return [self.begin, *self.changes, self.commit]


Decoded = Message | RowChanges | WholeTransaction


class RunDecoder:
    """Feeds ``decoder`` one message at a time; returns what is ready, in stream order."""

    def __init__(
        self,
        decoder: PgOutputDecoder,
        max_messages: int = RUN_MESSAGES,
        max_bytes: int = RUN_BYTES,
        *,
        held: Callable[[], None] | None = None,
    ) -> None:
        """``held``: called as a Begin is held for a whole transaction; None: every
        message is handed on as soon as it can be, a small transaction's too."""
        self.decoder = decoder
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._payloads: list[bytes] = []
        self._lsns: list[Lsn] = []
        self._held = 0
        self._on_held = held
        self._begin: Begin | None = None  # the Begin of a transaction that may be whole
        self._whole: list[Insert | Update | Delete] = []

    @property
    def holding(self) -> int:
        """How many row changes are held for the current run."""
        return len(self._payloads)

    def push_all(self, frames: Sequence[tuple[Lsn, bytes]]) -> Iterator[Decoded]:
        """``push`` of each frame of ``frames`` ((LSN, payload), in stream order), yielding
        what is ready as it is: a frame is pushed only once the caller has taken what the
        frames before it made, so that ``held`` for a Begin comes after the caller saw
        everything before that Begin, as with ``push`` a frame at a time. A small
        transaction all there, from its Begin to its Commit, is read whole at once
        (``PgOutputDecoder.whole_at``) - no Begin held, so ``held`` is not called for it:
        it is never open between two reads."""
        whole_at = self.decoder.whole_at if self._on_held is not None else None
        at, count = 0, len(frames)
        while at < count:
            if whole_at is not None and self._begin is None and not self._payloads:
                whole = whole_at(frames, at, WHOLE_AT_MOST)
                if whole is not None:
                    xid, final_lsn, begin_time, flags, end_lsn, commit_time, changes, at = whole
                    yield WholeTransaction(
                        xid, final_lsn, begin_time, flags, end_lsn, commit_time, changes
                    )
                    continue
            lsn, payload = frames[at]
            yield from self.push(payload, lsn)
            at += 1

    def push(self, payload: bytes, lsn: Lsn) -> Sequence[Decoded]:
        kind = payload[0] if payload else -1
        begin = self._begin
        if begin is not None:
            if kind in CHANGE_TYPES and len(self._whole) < WHOLE_AT_MOST:
                self._whole.append(self.decoder.decode_change(payload, lsn))
                return ()
            whole, self._begin, self._whole = self._whole, None, []
            if kind == _COMMIT:
                commit = self.decoder.decode_commit(payload, lsn)
                return (WholeTransaction.of(begin, tuple(whole), commit),)
            released: list[Decoded] = [begin, *whole]
            released.extend(self._push(payload, lsn))
            return released
        if kind == _BEGIN and self._on_held is not None and not self._payloads:
            self._begin = self.decoder.decode_begin(payload, lsn)
            self._on_held()
            return ()
        return self._push(payload, lsn)

    def _push(self, payload: bytes, lsn: Lsn) -> Sequence[Decoded]:
        if payload and payload[0] in CHANGE_TYPES:
            held = self._payloads
            held.append(payload)
            self._lsns.append(lsn)
            self._held += len(payload)
            if len(held) < self.max_messages and self._held < self.max_bytes:
                return ()
            return self._release()
        if not self._payloads:
            return (self.decoder.decode(payload, lsn),)
        released = self._release()
        released.append(self.decoder.decode(payload, lsn))
        return released

    def _release(self) -> list[Decoded]:
        payloads, lsns = self._payloads, self._lsns
        self._payloads, self._lsns, self._held = [], [], 0
        if len(payloads) < WALK_AT_LEAST:
            return [
                self.decoder.decode_change(p, lsn) for p, lsn in zip(payloads, lsns, strict=True)
            ]
        return [self.decoder.decode_changes(payloads, lsns)]
