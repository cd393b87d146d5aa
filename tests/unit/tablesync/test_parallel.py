"""Ranges read by threads: every block once, errors raised to the reader, no thread left."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from typing import cast

import pyarrow as pa
import pytest

from tablesync.copy import parallel, read_ahead
from tests.support.pgcluster import wait_until


def blocks_of(part: int) -> Iterator[pa.Table]:
    for block in range(3):
        yield pa.table({"part": [part], "block": [block]})


def copy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("copy-reader-")]


def test_every_block_of_every_part_once() -> None:
    seen = [tuple(b.to_pylist()[0].values()) for b in parallel(blocks_of, range(7), readers=3)]
    assert sorted(seen) == [(p, b) for p in range(7) for b in range(3)]
    assert copy_threads() == []


def test_a_readers_error_reaches_the_consumer_and_stops_the_others() -> None:
    def failing(part: int) -> Iterator[pa.Table]:
        if part == 4:
            raise ConnectionError("range 4 lost its connection")
        yield from blocks_of(part)

    with pytest.raises(ConnectionError, match="range 4"):
        list(parallel(failing, range(50), readers=2))
    assert copy_threads() == []


def test_a_consumer_that_stops_early_ends_the_readers_and_closes_their_reads() -> None:
    started: list[int] = []
    closed: list[int] = []

    def endless(part: int) -> Iterator[pa.Table]:
        started.append(part)
        try:
            while True:
                yield pa.table({"part": [part]})
        finally:
            closed.append(part)

    blocks = cast("Generator[pa.Table, None, None]", parallel(endless, range(4), readers=2))
    assert next(blocks).num_rows == 1
    blocks.close()
    assert copy_threads() == []
    # Every read begun is closed; at most two began (two readers), the others never did.
    assert sorted(closed) == sorted(started) and 1 <= len(started) <= 2


def one_row_a_block(block: bytes) -> pa.Table:
    return pa.table({"block": [int(block.decode().split()[0])]})


def test_read_ahead_hands_every_block_in_order_and_holds_one_waiting() -> None:
    """A sync worker's one copy (``read_ahead``): every block, in the copy's order, and
    the reader at most one block ahead of the consumer."""
    made: list[int] = []

    def rows() -> Iterator[bytes]:
        for block in range(6):
            made.append(block)
            yield f"{block}\n".encode()

    blocks = cast("Generator[pa.Table, None, None]", read_ahead(rows(), one_row_a_block, 2))
    first = next(blocks)
    wait_until(lambda: len(made) >= 3, timeout=60, what="the reader to fill what may wait")
    time.sleep(0.1)  # room for a fourth, were the reader to take one: it must not
    # One block taken, one waiting, one read and held until there is room: never more.
    assert len(made) == 3
    rest = list(blocks)
    assert [b.column("block")[0].as_py() for b in [first, *rest]] == list(range(6))
    assert copy_threads() == []


def test_read_ahead_starts_no_thread_for_a_copy_of_one_short_block() -> None:
    """A small table's copy (shorter than a block) is read and parsed where it is
    consumed: no thread, whose start and hand-over wait for Python's lock in a busy
    daemon."""
    seen: list[list[threading.Thread]] = []

    def parse(block: bytes) -> pa.Table:
        seen.append(copy_threads())
        return pa.table({"rows": [block.count(b"\n")]})

    copied = list(read_ahead((b"%d\n" % n for n in range(100)), parse, 1 << 20))
    assert [b.column("rows")[0].as_py() for b in copied] == [100]
    assert seen == [[]]
    assert list(read_ahead(iter([]), parse)) == []


def test_read_ahead_given_up_stops_its_reader() -> None:
    made: list[int] = []

    def rows() -> Iterator[bytes]:
        for block in range(50):
            made.append(block)
            yield f"{block}\n".encode()

    blocks = cast("Generator[pa.Table, None, None]", read_ahead(rows(), one_row_a_block, 2))
    assert next(blocks).num_rows == 1
    blocks.close()
    assert copy_threads() == []
    read = len(made)
    time.sleep(0.1)
    assert len(made) == read <= 3


def test_read_ahead_raises_the_copys_error_to_the_consumer() -> None:
    def rows() -> Iterator[bytes]:
        yield b"0\n"
        yield b"1\n"
        raise ConnectionError("the copy's connection was lost")

    with pytest.raises(ConnectionError, match="lost"):
        list(read_ahead(rows(), one_row_a_block, 2))
    assert copy_threads() == []


def test_any_part_is_read_none_included() -> None:
    """A part is what the caller says it is: ``None`` is one too, not the end of the parts."""
    read: list[object] = []

    def one(part: object) -> Iterator[pa.Table]:
        read.append(part)
        yield pa.table({"part": [str(part)]})

    assert len(list(parallel(one, [None, 0, ""], readers=2))) == 3
    assert sorted(map(str, read)) == ["", "0", "None"]
    assert copy_threads() == []
