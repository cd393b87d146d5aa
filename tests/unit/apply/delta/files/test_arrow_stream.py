"""Parquet written to a store's Python file through ``arrow_stream``: the same file, handed
over a buffer at a time - not one call into Python (and one wait for its lock) a page."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from apply.delta.files.store import STREAM_BUFFER, arrow_stream


class CountedFile(io.BytesIO):
    """A store's file that counts the calls that write to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        return super().write(data)


def rows(count: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            "v": pa.array([f"value {i}" for i in range(count)]),
            "x": pa.array([i / 7 for i in range(count)]),
        }
    )


def test_a_file_is_handed_over_a_buffer_at_a_time_and_left_open() -> None:
    table = rows(300_000)
    plain = CountedFile()
    pq.write_table(table, plain, compression="snappy", data_page_size=64 << 10)
    streamed = CountedFile()
    with arrow_stream(streamed) as stream:
        pq.write_table(table, stream, compression="snappy", data_page_size=64 << 10)
    assert not streamed.closed  # its fsync or PUT is the store's, after this
    assert streamed.getvalue() == plain.getvalue()
    size = len(streamed.getvalue())
    assert plain.writes > 20  # a call a page, at least
    assert streamed.writes <= size // STREAM_BUFFER + 1
    assert pq.read_table(io.BytesIO(streamed.getvalue())).equals(table)


def test_a_file_written_by_batches_has_its_size_before_the_stream_ends() -> None:
    """``overwrite.append`` reads a file's size from the stream once its writer closes."""
    file = CountedFile()
    with arrow_stream(file) as stream:
        writer = pq.ParquetWriter(stream, rows(1).schema, compression="snappy")
        for _ in range(3):
            writer.write_table(rows(10_000))
        writer.close()
        size = stream.tell()
    assert size == len(file.getvalue()) and file.writes <= 1
    assert pq.read_table(io.BytesIO(file.getvalue())).num_rows == 30_000
