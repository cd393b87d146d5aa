"""COPY output to typed Arrow tables, in bounded blocks (the fast copy path).

The table is read with ``COPY (...) TO STDOUT WITH (FORMAT csv)``; rows are
gathered into blocks of about ``block_bytes`` and each block is parsed by
pyarrow's CSV reader (C, multithreaded) into binary columns, then typed by
the same converters the leader uses (``apply.columnar``), so a copied value
and a replicated value of the same column are always the same. Memory
stays at a few blocks whatever the table's size.

PostgreSQL's CSV output writes NULL as an unquoted empty field and the
empty string as ``""``; the reader is told exactly that.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import Final

import pyarrow as pa
import pyarrow.csv as pacsv

from apply.columnar import to_arrow
from apply.schema import TargetSchema

BLOCK_BYTES: Final = 32 << 20


def blocks(rows: Iterable[bytes], block_bytes: int = BLOCK_BYTES) -> Iterator[bytes]:
    """CSV rows (each ending in a newline) joined into blocks cut at row boundaries."""
    pending: list[bytes] = []
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


def arrow_blocks(rows: Iterable[bytes], schema: TargetSchema) -> Iterator[pa.Table]:
    for block in blocks(rows):
        yield parse_block(block, schema)
