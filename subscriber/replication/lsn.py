"""Log sequence numbers: 64-bit WAL positions written ``X/Y`` by PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Final, cast

_TEXT: Final = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


class Lsn(int):
    """A WAL position. An ``int`` so that it orders, hashes and packs for free."""

    __slots__ = ()

    def __new__(cls, value: int = 0) -> Lsn:
        if not 0 <= value < 1 << 64:
            raise ValueError(f"LSN out of range: {value}")
        return super().__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> Lsn:
        """``'16/B374D848'`` -> Lsn; a ValueError names the bad text."""
        match = _TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"not an LSN (expected X/Y in hex): {text!r}")
        return cls(int(match.group(1), 16) << 32 | int(match.group(2), 16))

    def __str__(self) -> str:
        return f"{self >> 32:X}/{self & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


ZERO: Final = Lsn(0)

# An LSN read from the wire as an unsigned 64-bit integer: in range by construction, so
# made without ``Lsn.__new__``'s check (0.2 us less, and a transaction's frames carry five).
unpacked: Final = cast(Callable[[int], Lsn], partial(int.__new__, Lsn))

# A WAL page opens with a short header; a segment's first page with a long one.
SHORT_PAGE_HEADER: Final = 24
LONG_PAGE_HEADER: Final = 40


def record_end(insert: Lsn, block_size: int, segment_size: int) -> Lsn:
    """Where the last WAL record ends, from ``pg_current_wal_insert_lsn()`` (``insert``).

    When that record ended at a page's end, the insert position points past the next page's
    header, where the next record will begin. No record ends there, so no slot can confirm it
    before more WAL is written - on an idle server, never. "Everything written so far" is
    this position, the one a commit reports and a slot confirms.
    """
    if insert % segment_size == LONG_PAGE_HEADER:
        return Lsn(insert - LONG_PAGE_HEADER)
    if insert % block_size == SHORT_PAGE_HEADER:
        return Lsn(insert - SHORT_PAGE_HEADER)
    return insert
