"""Row values to Arrow columns, a column at a time (the mapping of ``apply.columns.typemap``).

Values arrive as the bytes of PostgreSQL's text output (or, with ``binary:
true``, of its binary output: ``apply.columns.binary``) (the replication
connection fixes DateStyle ISO, TimeZone UTC, IntervalStyle postgres and
client_encoding UTF8, so the forms are known). Scalars are parsed by
Arrow's compute casts in C - no Python object per value; arrays and
bytea go through psycopg's loaders. A value the target type cannot hold
(``infinity`` dates, years past 9999, NaN in a ``numeric(p,s)``, a
multidimensional array) raises ``ValueConversionError`` naming the column
and what is wrong - never a silently different value. Error messages never
carry the value itself: logs must not leak row data.
"""

from __future__ import annotations

import binascii
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import pq
from psycopg.adapt import Transformer

import apply.columns.binary
from apply.columns import typemap
from apply.columns.typemap import ColumnType
from apply.core.errors import ApplyError

if TYPE_CHECKING:
    from apply.columns.schema import TargetColumn

# Text-form bytes (None for NULL), or an Arrow binary column of them.
Values: TypeAlias = "Sequence[bytes | None] | pa.Array"

_INTEGERS: Final = {typemap.INT2: pa.int16(), typemap.INT4: pa.int32(), typemap.INT8: pa.int64()}
_FLOATS: Final = {typemap.FLOAT4: pa.float32(), typemap.FLOAT8: pa.float64()}
_DATETIMES: Final = {
    typemap.DATE: pa.date32(),
    typemap.TIMESTAMP: pa.timestamp("us"),
    typemap.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
}
_YEAR: Final = re.compile(rb"^(\d+)-")


class ValueConversionError(ApplyError):
    """A value that its target column cannot hold (the data's limit, not pgsub's)."""

    def __init__(self, column: str, column_type: ColumnType, problem: str) -> None:
        self.column = column
        self.problem = problem
        super().__init__(
            f"column {column!r} ({column_type.spark_type}): {problem}; change the column on "
            "the publisher, leave it out of the publication's column list, or skip the "
            "transaction with `pgsub skip`"
        )


class ValueParseError(ValueConversionError):
    """A value pgsub failed to read in the form PostgreSQL sent it: pgsub's fault, not the data's.

    The values PostgreSQL's output and send functions write are valid by construction, so a
    value that does not parse is a gap in pgsub's readers, and the message says so."""

    def __init__(self, column: str, column_type: ColumnType, problem: str, form: str) -> None:
        self.column = column
        self.problem = problem
        ApplyError.__init__(
            self,
            f"column {column!r} (type OID {column_type.wire_oid}, Delta "
            f"{column_type.spark_type}): pgsub could not read a value in PostgreSQL's {form} "
            f"format: {problem}. This is pgsub's error, not the data's: please report it with "
            "this message. The subscription retries; "
            + (
                "`binary: false` for the subscription reads the column as text instead, and "
                if form == "binary"
                else ""
            )
            + "`pgsub skip` skips the transaction (its changes are not applied)",
        )


def arrow_type(column_type: ColumnType) -> pa.DataType:
    element = _scalar_arrow_type(column_type.oid, column_type.typmod)
    return pa.list_(element) if column_type.is_array else element


def arrow_schema(columns: Iterable[TargetColumn]) -> pa.Schema:
    """Target columns as an Arrow schema: what delta-rs creates a table with and writes."""
    return pa.schema([(c.name, arrow_type(c.type)) for c in columns])


def _scalar_arrow_type(oid: int, typmod: int) -> pa.DataType:
    if oid in _INTEGERS:
        return _INTEGERS[oid]
    if oid in _FLOATS:
        return _FLOATS[oid]
    if oid in _DATETIMES:
        return _DATETIMES[oid]
    if oid == typemap.BOOL:
        return pa.bool_()
    if oid == typemap.BYTEA:
        return pa.binary()
    if oid == typemap.NUMERIC:
        numeric = typemap.NumericTypmod.decode(typmod)
        if numeric is not None and numeric.fits_spark_decimal():
            return pa.decimal128(numeric.precision, numeric.scale)
    return pa.string()


def _listed(values: Values) -> Sequence[bytes | None]:
    return values.to_pylist() if isinstance(values, pa.Array) else values


def to_arrow(
    values: Values, column_type: ColumnType, column: str, *, binary: bool = False
) -> pa.Array:
    """The Arrow column of ``values`` (text-format bytes, or binary-format with ``binary``;
    None for NULL)."""
    target = arrow_type(column_type)
    if binary:
        try:
            return apply.columns.binary.to_arrow(values, column_type, target)
        except apply.columns.binary.BinaryValueError as exc:
            raise ValueConversionError(column, column_type, exc.problem) from exc
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            problem = (
                "a value with more digits than the declared precision"
                if column_type.oid == typemap.NUMERIC
                else f"a value that does not fit {column_type.spark_type}"
            )
            raise ValueConversionError(column, column_type, problem) from exc
        except (struct.error, ValueError, IndexError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            raise ValueParseError(column, column_type, problem, "binary") from exc
    if column_type.is_array:
        return _arrays(_listed(values), column_type, target, column)
    try:
        if pa.types.is_binary(target):
            return pa.array([_unhex(v) for v in _listed(values)], type=pa.binary())
        raw = values if isinstance(values, pa.Array) else pa.array(values, type=pa.binary())
        if pa.types.is_string(target):
            text: pa.Array = raw.cast(pa.string())
            return text
        if pa.types.is_boolean(target):
            result: pa.Array = pc.equal(raw, pa.scalar(b"t", pa.binary()))
            return result
        text = raw.cast(pa.string())
    except (pa.ArrowInvalid, ValueError) as exc:
        problem = "not hex bytea" if pa.types.is_binary(target) else "not UTF-8 text"
        raise ValueParseError(column, column_type, problem, "text") from exc
    try:
        parsed: pa.Array = pc.cast(text, target)
        return parsed
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        why = _why_not(_listed(values), column_type)
        if why is None:
            raise ValueParseError(
                column, column_type, f"not {column_type.spark_type} text", "text"
            ) from exc
        raise ValueConversionError(column, column_type, why) from exc


def binary_text(value: bytes, column_type: ColumnType) -> str:
    """One binary-format value as text, for a conflict report (never for a target column)."""
    try:
        decoded = to_arrow([value], column_type, "", binary=True).to_pylist()[0]
    except ValueConversionError:
        return "\\x" + value.hex()
    return decoded if isinstance(decoded, str) else str(decoded)


def _unhex(value: bytes | None) -> bytes | None:
    # bytea's hex output: \x followed by two hex digits a byte.
    return None if value is None else binascii.a2b_hex(value[2:])


def _why_not(values: Sequence[bytes | None], column_type: ColumnType) -> str | None:
    """Names the first value the target type cannot hold, without printing it; None when
    every value is one the type can hold (pgsub failed to read one)."""
    for value in values:
        if value is None:
            continue
        lowered = value.lower()
        if lowered in (b"infinity", b"-infinity"):
            return f"{value.decode()} has no {column_type.spark_type} representation"
        if lowered in (b"nan",):
            return f"NaN has no {column_type.spark_type} representation"
        if lowered.endswith(b" bc"):
            return f"a BC date is outside {column_type.spark_type}'s range (years 1 to 9999)"
        year = _YEAR.match(value)
        if year is not None and int(year.group(1)) > 9999:
            return f"a year after 9999 is outside {column_type.spark_type}'s range"
    if column_type.oid == typemap.NUMERIC:
        return "a value with more digits than the declared precision"
    return None


def _array_loader(column_type: ColumnType) -> Callable[[bytes], Any]:
    oid = typemap.TEXT if column_type.text_form else column_type.oid
    array_oid = typemap.ARRAY_OF.get(oid, typemap.ARRAY_OF[typemap.TEXT])
    return Transformer().get_loader(array_oid, pq.Format.TEXT).load


def _arrays(
    values: Sequence[bytes | None], column_type: ColumnType, target: pa.DataType, column: str
) -> pa.Array:
    load = _array_loader(column_type)
    lists: list[Any] = []
    try:
        for value in values:
            if value is None:
                lists.append(None)
                continue
            items = load(value)
            if any(isinstance(item, list) for item in items):
                raise ValueConversionError(
                    column, column_type, "a multidimensional array has no array<> representation"
                )
            lists.append(items)
    except psycopg.DataError as exc:
        raise ValueConversionError(column, column_type, _why_not_elements(values)) from exc
    try:
        return pa.array(lists, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        problem = "an element that does not fit the element type"
        if any(
            isinstance(i, Decimal) and not i.is_finite() for items in lists if items for i in items
        ):
            problem = "a NaN or infinite element has no decimal representation"
        raise ValueConversionError(column, column_type, problem) from exc


def _why_not_elements(values: Sequence[bytes | None]) -> str:
    for value in values:
        if value is not None and b"infinity" in value.lower():
            return "an infinite element is outside the element type's range"
    return "an element outside the element type's range"
