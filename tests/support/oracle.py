"""The test oracle: does a Delta table hold exactly the publisher's rows?

Both sides are read into canonical Python values, type-aware (timestamps as
UTC instants, numerics by value, float4 at float4 precision, NaN equal to
NaN, arrays element by element, bytes as bytes), and compared as multisets
of rows, so a missing duplicate counts. Columns that the type mapping (``apply.columns.typemap``)
maps to
a string are read from PostgreSQL in their text form (``col::text``), which
is what the Delta column must hold.

On a difference, the error lists the rows that differ; when key columns are
given, rows with the same key are paired and the differing cells named.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from apply.columns import typemap
from apply.columns.typemap import ColumnType
from subscriber.replication.catalog import fetch_type_rows
from subscriber.replication.names import split_qualified

Row = tuple[Any, ...]
MAX_REPORTED = 20


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int  # base type (domains resolved); the element type when ``is_array``
    typmod: int
    is_array: bool = False

    @property
    def column_type(self) -> ColumnType:
        if self.is_array:
            return ColumnType(self.type_oid, self.typmod, is_array=True)
        return typemap.resolve(self.type_oid, self.typmod, lambda oid: None)

    @property
    def spark_type(self) -> str:
        return self.column_type.spark_type


@dataclass
class TableDiff:
    """What differs between the expected (publisher) and actual (Delta) rows."""

    columns: Sequence[str]
    missing: list[Row] = field(default_factory=list)  # in the publisher, not in Delta
    extra: list[Row] = field(default_factory=list)  # in Delta, not in the publisher
    changed: list[tuple[Row, Row, list[str]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.changed)

    def report(self) -> str:
        lines = [f"columns: {', '.join(self.columns)}"]
        for expected, actual, cells in self.changed[:MAX_REPORTED]:
            lines.append(f"changed: {', '.join(cells)}")
            lines.append(f"  publisher: {expected!r}")
            lines.append(f"  delta:     {actual!r}")
        lines += [f"missing from delta: {row!r}" for row in self.missing[:MAX_REPORTED]]
        lines += [f"extra in delta: {row!r}" for row in self.extra[:MAX_REPORTED]]
        total = len(self.changed) + len(self.missing) + len(self.extra)
        if total > 3 * MAX_REPORTED:
            lines.append(f"... {total} differences in all")
        return "\n".join(lines)


def _canonical(value: Any, column: Column) -> Any:
    """A hashable value that compares equal exactly when the values are the same."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        resolved = column.column_type
        element = Column(column.name, resolved.oid, resolved.typmod)
        return ("array", tuple(_canonical(v, element) for v in value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float):
        if math.isnan(value):
            return ("float", "NaN")
        if column.type_oid == typemap.FLOAT4:
            value = struct.unpack("f", struct.pack("f", value))[0]
        return ("float", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, Decimal):
        return ("decimal", "NaN" if value.is_nan() else value.normalize())
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return ("timestamptz", value.astimezone(UTC))
        return ("timestamp", value)
    if isinstance(value, bytes | bytearray | memoryview):
        return ("bytes", bytes(value))
    return (type(value).__name__, value)


def canonical_row(row: Sequence[Any], columns: Sequence[Column]) -> Row:
    return tuple(_canonical(v, c) for v, c in zip(row, columns, strict=True))


def compare_rows(
    expected: Sequence[Row],
    actual: Sequence[Row],
    columns: Sequence[Column],
    key: Sequence[str] = (),
) -> TableDiff:
    """Multiset comparison of two row lists, both in ``columns`` order."""
    want = Counter(canonical_row(r, columns) for r in expected)
    got = Counter(canonical_row(r, columns) for r in actual)
    names = [c.name for c in columns]
    diff = TableDiff(columns=names)
    missing = list((want - got).elements())
    extra = list((got - want).elements())
    if key:
        positions = [names.index(k) for k in key]
        extra_by_key: dict[Row, list[Row]] = {}
        for row in extra:
            extra_by_key.setdefault(tuple(row[p] for p in positions), []).append(row)
        for row in missing:
            candidates = extra_by_key.get(tuple(row[p] for p in positions))
            if candidates:
                other = candidates.pop()
                cells = [n for n, a, b in zip(names, row, other, strict=True) if a != b]
                diff.changed.append((row, other, cells))
            else:
                diff.missing.append(row)
        diff.extra = [r for rows in extra_by_key.values() for r in rows]
    else:
        diff.missing, diff.extra = missing, extra
    return diff


def publisher_columns(conn: psycopg.Connection[Any], table: str) -> list[Column]:
    """The table's live, non-generated columns, types resolved as the product resolves them."""
    rows = conn.execute(
        """
        SELECT a.attname, a.atttypid, a.atttypmod
          FROM pg_attribute a
         WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attgenerated = ''
         ORDER BY a.attnum
        """,
        [table],
    ).fetchall()
    columns = []
    for name, oid, typmod in rows:
        resolved = typemap.resolve(
            int(oid), int(typmod), lambda o: fetch_type_rows(conn, [o]).get(o)
        )
        columns.append(Column(name, resolved.oid, resolved.typmod, resolved.is_array))
    return columns


def _select_expr(column: Column) -> sql.Composable:
    ident = sql.Identifier(column.name)
    resolved = column.column_type
    # char(n) keeps its padding in its output form; a cast to text would strip it.
    if not resolved.text_form or resolved.oid == typemap.BPCHAR:
        return ident
    if resolved.is_array:
        return sql.SQL("{}::text[]").format(ident)
    # The output function's text: a cast can differ from it (text(inet) always adds the
    # netmask), format's %s cannot.
    return sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE pg_catalog.format('%s', {0}) END").format(
        ident
    )


def read_publisher(
    conn: psycopg.Connection[Any], table: str, columns: Sequence[Column]
) -> list[Row]:
    schema, name = split_qualified(table)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(_select_expr(c) for c in columns),
        sql.Identifier(schema, name),
    )
    return [tuple(r) for r in conn.execute(query).fetchall()]


def read_delta(spark: Any, path: str, columns: Sequence[Column]) -> list[Row]:
    """The Delta table's rows; a table never written holds none."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    frame = spark.read.format("delta").load(path).select(*[f"`{c.name}`" for c in columns])
    table = frame.toArrow()
    return [tuple(row[c.name] for c in columns) for row in table.to_pylist()]


def read_delta_rs(path: str, columns: Sequence[Column]) -> list[Row]:
    """The Delta table's rows as delta-rs (Python's ``deltalake``, polars) reads them.

    A reader that is not Spark: it refuses a table with a reader feature it
    lacks (type widening, deletion vectors in 1.6), which is what the tables
    pgsub writes by default must never have - except deletion vectors, which
    a table gains when its batches would otherwise rewrite it: such a table
    is read through ``deltalake.QueryBuilder`` (delta-rs's DataFusion), the
    delta-rs reader that applies them (docs/tables.md). A table in an object
    store is read from it, with the storage its warehouse registered.
    """
    import deltalake

    from apply.delta.writer.local_tables import is_table
    from apply.delta.writer.local_tables import opened as open_table

    if not is_table(path):
        return []
    opened = open_table(path)
    if "deletionVectors" in (opened.protocol().reader_features or ()):
        names = ", ".join('"' + c.name.replace('"', '""') + '"' for c in columns)
        found = deltalake.QueryBuilder().register("t", opened).execute(f"SELECT {names} FROM t")
        table = pa.table(found.read_all())
    else:
        table = opened.to_pyarrow_table(columns=[c.name for c in columns])
    return [tuple(row[c.name] for c in columns) for row in table.to_pylist()]


# The readers a test can check a table with: Spark (needs a session) and delta-rs.
SPARK, DELTA_RS = "spark", "delta-rs"


def diff_delta_against_publisher(
    conn: psycopg.Connection[Any],
    table: str,
    spark: Any,
    path: str,
    key: Sequence[str] = (),
    reader: str = SPARK,
) -> TableDiff:
    columns = publisher_columns(conn, table)
    actual = read_delta(spark, path, columns) if reader == SPARK else read_delta_rs(path, columns)
    return compare_rows(read_publisher(conn, table, columns), actual, columns, key)


def assert_delta_equals_publisher(
    conn: psycopg.Connection[Any],
    table: str,
    spark: Any,
    path: str,
    key: Sequence[str] = (),
    readers: Sequence[str] = (SPARK, DELTA_RS),
) -> None:
    """Both readers by default: Spark, and delta-rs, which must open every table pgsub writes
    with its default ``table_features``."""
    for reader in readers:
        diff = diff_delta_against_publisher(conn, table, spark, path, key, reader)
        if diff:
            raise AssertionError(
                f"Delta table {path}, read by {reader}, differs from {table}:\n{diff.report()}"
            )
