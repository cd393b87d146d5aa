"""COPY output to typed Arrow tables, in bounded blocks (the fast copy path).

The table is read with ``COPY (...) TO STDOUT WITH (FORMAT csv)``; rows are
gathered into blocks of about ``block_bytes`` and each block is parsed by
pyarrow's CSV reader (C, multithreaded) into binary columns, then typed by
the same converters the leader uses (``apply.columns.columnar``), so a copied value
and a replicated value of the same column are always the same. Memory
stays at a few blocks whatever the table's size.

PostgreSQL's CSV output writes NULL as an unquoted empty field and the
empty string as ``""``; the reader is told exactly that.

A large table is cut into CTID ranges (``split``), each read by its own
connection under the sync slot's exported snapshot (``RangeReader``):
by threads of this process (``parallel``) on a local Spark, by Spark tasks
on the executors of a cluster. Every row lies in exactly one range,
whatever the split: a row's CTID under the snapshot is fixed.
"""

from __future__ import annotations

import io
import math
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql
from psycopg.abc import Buffer

from apply.columns.columnar import to_arrow
from apply.columns.schema import TargetSchema
from subscriber.replication import session
from subscriber.replication.copy_out import copy_out
from tablesync.publication import PublishedTable

BLOCK_BYTES: Final = 32 << 20
MAX_RANGES: Final = 1024
PAGE_BYTES: Final = 8192  # PostgreSQL's default block size; only sizes the ranges

Part = TypeVar("Part")


@dataclass(frozen=True, slots=True)
class CopySettings:
    """How a table's copy is read (the subscription's ``copy`` config)."""

    ranges: int | None = None  # CTID ranges per table; None: one per range_bytes of heap
    range_bytes: int = 64 << 20
    readers: int = 1  # ranges read at once by the daemon (a cluster: its cores)
    resumable: bool = True  # a keyed table in ranges staged range by range (tablesync.resume)

    def ranges_for(self, heap_blocks: int, on_executors: bool) -> int:
        """How many ranges to read a table in: with one reader in this process and no
        number set, one (PostgreSQL's way: the slot's own transaction copies it)."""
        if self.ranges is None and self.readers == 1 and not on_executors:
            return 1
        return range_count(heap_blocks, self.range_bytes, self.ranges)


def blocks(rows: Iterable[Buffer], block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """CSV rows (each ending in a newline) joined into blocks cut at row boundaries."""
    pending: list[Buffer] = []
    size = 0
    for row in rows:
        pending.append(row)
        size += len(row)
        if size >= block_bytes:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def parse_block(block: bytes, schema: TargetSchema) -> pa.Table:
    """One block of PostgreSQL CSV into a typed Arrow table laid out as ``schema``."""
    names = [c.name for c in schema.columns]
    raw = pacsv.read_csv(
        io.BytesIO(block),
        read_options=pacsv.ReadOptions(column_names=names, block_size=min(len(block) + 1, 1 << 26)),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.binary()),
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            null_values=[""],
        ),
    )
    return pa.table(
        {
            column.name: to_arrow(raw.column(i).combine_chunks(), column.type, column.name)
            for i, column in enumerate(schema.columns)
        }
    )


def copied_blocks(
    conn: psycopg.Connection[Any], query: sql.Composable, schema: TargetSchema
) -> Iterator[pa.Table]:
    """``arrow_blocks`` of ``query`` (a ``COPY ... TO STDOUT``) on ``conn``, its rows read
    off libpq (``subscriber.replication.copy_out``: psycopg's ``Copy`` cost four times as
    much a row). However the copy ends - read to its end, a block that does not parse, a
    reader that stops - ``conn`` takes its next command (a ``ROLLBACK TO SAVEPOINT``)."""
    rows = copy_out(conn.pgconn, query.as_string(conn), conn.info.encoding)
    with closing(rows):
        yield from arrow_blocks(rows, schema)


def arrow_blocks(rows: Iterable[Buffer], schema: TargetSchema) -> Iterator[pa.Table]:
    for block in blocks(rows):
        yield parse_block(block, schema)


@dataclass(frozen=True, slots=True)
class BlockRange:
    """Heap blocks ``[first, stop)`` of a table; ``stop`` None: to its end."""

    first: int
    stop: int | None

    def condition(self) -> sql.Composable | None:
        """The rows of the range, as a WHERE condition (None: every row)."""
        bounds = []
        if self.first > 0:
            bounds.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.first},0)")))
        if self.stop is not None:
            bounds.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.stop},0)")))
        return sql.SQL(" AND ").join(bounds) if bounds else None


def range_count(heap_blocks: int, range_bytes: int, ranges: int | None) -> int:
    """How many ranges a table of ``heap_blocks`` is read in: ``ranges`` when set, else
    one per ``range_bytes`` of heap; at least one, at most one per block."""
    wanted = ranges or math.ceil(heap_blocks * PAGE_BYTES / range_bytes)
    return max(1, min(wanted, heap_blocks, MAX_RANGES))


def split(heap_blocks: int, count: int) -> list[BlockRange]:
    """``count`` ranges of about equal size covering every block, the last open-ended
    (blocks added after the size was read hold no row the snapshot sees, but the
    ranges must not depend on that)."""
    count = max(1, min(count, heap_blocks))
    firsts = [heap_blocks * i // count for i in range(count)]
    stops: list[int | None] = [*firsts[1:], None]
    return [BlockRange(first, stop) for first, stop in zip(firsts, stops, strict=True)]


@dataclass(frozen=True)
class RangeReader:
    """Reads one range of ``table`` under the exported ``snapshot``.

    Picklable, so a Spark task on an executor runs it: it opens its own
    connection with the subscription's connection string (kept out of
    ``repr``, so out of every log and Spark UI).
    """

    conninfo: str = field(repr=False)
    snapshot: str
    table: PublishedTable
    schema: TargetSchema

    def __call__(self, part: BlockRange) -> Iterator[pa.Table]:
        return self.rows(part.condition())

    def rows(
        self, condition: sql.Composable | None, schema: TargetSchema | None = None
    ) -> Iterator[pa.Table]:
        """The rows meeting ``condition``, laid out as ``schema`` (default: the table's;
        another names some of its columns)."""
        schema = schema or self.schema
        columns = [c.name for c in schema.columns]
        with session.connect(self.conninfo) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(self.snapshot_literal))
            yield from copied_blocks(conn, self.table.copy_query(condition, columns), schema)
            conn.execute("COMMIT")

    @property
    def snapshot_literal(self) -> sql.Literal:
        return sql.Literal(self.snapshot)


_DONE: Final = object()


def read_ahead(
    rows: Iterable[Buffer],
    parse: Callable[[bytes], pa.Table],
    block_bytes: int = BLOCK_BYTES,
) -> Iterator[pa.Table]:
    """The copy's ``rows`` in ``blocks`` parsed by ``parse``, read and parsed by a thread
    one block ahead of the consumer: a large table's next block is read and parsed while
    the last is written (Parquet's writer gives Python's lock up while it encodes). At
    most three blocks are held: the one written, one waiting, the one being read.

    The first block is read here: shorter than ``block_bytes``, it is the whole copy (a
    small table, most of them), parsed here, and no thread starts. In a busy daemon a
    thread's start and each hand-over wait for Python's lock: about 10 ms a copy beside a
    thread running Python, for nothing to read ahead."""
    raw = blocks(rows, block_bytes)
    first = next(raw, None)
    if first is None:
        return
    if len(first) < block_bytes:
        yield parse(first)
        return

    def read(_: object) -> Iterator[pa.Table]:
        yield parse(first)
        for block in raw:
            yield parse(block)

    yield from parallel(read, ["whole"], readers=1, waiting=1)


def parallel(
    read: Callable[[Part], Iterator[pa.Table]],
    parts: Sequence[Part],
    readers: int,
    *,
    waiting: int | None = None,
) -> Iterator[pa.Table]:
    """The blocks of every part, ``readers`` parts read at once by threads, in no set
    order; at most ``waiting`` blocks read and not yet taken (default: two a reader). A
    reader's error is raised here; closing the iterator stops the readers."""
    pending = iter(parts)
    taken = threading.Lock()
    out: queue.Queue[object] = queue.Queue(maxsize=waiting or 2 * readers)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            while not stop.is_set():
                with taken:
                    part = next(pending, _DONE)
                if part is _DONE:
                    break
                blocks = read(cast("Part", part))
                try:
                    for block in blocks:
                        if not put(block):
                            return
                finally:
                    close = getattr(blocks, "close", None)
                    if close is not None:
                        close()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(exc)
        finally:
            put(_DONE)

    threads = [
        threading.Thread(target=work, name=f"copy-reader-{n}", daemon=True)
        for n in range(max(1, min(readers, len(parts))))
    ]
    for thread in threads:
        thread.start()
    try:
        running = len(threads)
        while running:
            item = out.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for thread in threads:
            thread.join()
