"""A session's messages decoded in order, consecutive row changes as one run (no I/O).

In a large transaction most messages are Insert, Update or Delete; decoding
them a run at a time lets ``PgOutputDecoder.decode_changes`` read their
values a column at a time. A run is held until the next message that is
not a row change - a transaction's run always ends at its Commit, a
streamed block's at its Stream Stop - or until it reaches ``max_messages``
or ``max_bytes``, so holding it delays nothing that could be applied and
bounds the memory it takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Message
from subscriber.replication.pgoutput import CHANGE_TYPES, WALK_AT_LEAST, PgOutputDecoder
from subscriber.replication.tuples import RowChanges

RUN_MESSAGES: Final = 8192
RUN_BYTES: Final = 32 << 20

Decoded = Message | RowChanges


class RunDecoder:
    """Feeds ``decoder`` one message at a time; returns what is ready, in stream order."""

    def __init__(
        self,
        decoder: PgOutputDecoder,
        max_messages: int = RUN_MESSAGES,
        max_bytes: int = RUN_BYTES,
    ) -> None:
        self.decoder = decoder
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._payloads: list[bytes] = []
        self._lsns: list[Lsn] = []
        self._held = 0

    @property
    def holding(self) -> int:
        """How many row changes are held for the current run."""
        return len(self._payloads)

    def push(self, payload: bytes, lsn: Lsn) -> Sequence[Decoded]:
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
            return [self.decoder.decode(p, lsn) for p, lsn in zip(payloads, lsns, strict=True)]
        return [self.decoder.decode_changes(payloads, lsns)]
