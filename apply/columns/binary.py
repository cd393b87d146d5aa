"""Values in PostgreSQL's binary format (``binary: true``) to the Arrow columns of text mode.

With ``binary: true`` pgoutput sends each value of a type that has a binary
output function in that form (its ``typsend``: big-endian integers,
microseconds since 2000-01-01, base-10000 numeric digits, ...). The target
columns stay exactly those of text mode (``apply.columns.typemap``): fixed-width
scalars are decoded with numpy a column at a time (no Python object per
value); numeric, the text-form types and arrays one value at a time, into
PostgreSQL's own text output where the Delta column holds text - so a table
replicated in binary mode equals one replicated in text mode, value for
value (tests/integration/apply/test_apply_scenarios.py checks every type).

A type pgsub has no binary reader for here (composites, ranges, geometric
and extension types, inet, money, ...) never reaches this module on the
apply path: the publisher turns its values into their text forms first
(``apply.core.rendering``), as PostgreSQL's subscriber reads them with the type's
own receive function. Values that the target cannot hold are the same
errors as in text mode, never different values. Pure.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from apply.columns import typemap
from apply.columns.typemap import ColumnType

Values: TypeAlias = "Sequence[bytes | None] | pa.Array"

# Days and microseconds between 1970-01-01 (Arrow) and 2000-01-01 (PostgreSQL).
_EPOCH_DAYS: Final = 10_957
_EPOCH_US: Final = _EPOCH_DAYS * 86_400 * 1_000_000
# Years 1 to 9999, the range of Spark's date and timestamp types.
_MIN_DAYS: Final = -719_162 - _EPOCH_DAYS
_MAX_DAYS: Final = 2_932_896 - _EPOCH_DAYS
_MIN_US: Final = -62_135_596_800_000_000 - _EPOCH_US
_MAX_US: Final = 253_402_300_799_999_999 - _EPOCH_US
_INT32: Final = (-(2**31), 2**31 - 1)
_INT64: Final = (-(2**63), 2**63 - 1)

_FIXED: Final[dict[int, tuple[str, pa.DataType]]] = {
    typemap.INT2: (">i2", pa.int16()),
    typemap.INT4: (">i4", pa.int32()),
    typemap.INT8: (">i8", pa.int64()),
    typemap.FLOAT4: (">f4", pa.float32()),
    typemap.FLOAT8: (">f8", pa.float64()),
    typemap.BOOL: ("u1", pa.bool_()),
    typemap.DATE: (">i4", pa.date32()),
    typemap.TIMESTAMP: (">i8", pa.timestamp("us")),
    typemap.TIMESTAMPTZ: (">i8", pa.timestamp("us", tz="UTC")),
}
# Types whose binary form is their text (UTF-8): text, varchar, bpchar, name, json, an enum's label.
_TEXTUAL: Final = frozenset(
    {typemap.TEXT, typemap.VARCHAR, typemap.BPCHAR, typemap.NAME, typemap.JSON}
)
_NUMERIC_NAN: Final = 0xC000
_NUMERIC_PINF: Final = 0xD000
_NUMERIC_NINF: Final = 0xF000
_NUMERIC_NEG: Final = 0x4000


class BinaryValueError(ValueError):
    """A binary value the target column cannot hold, or of a type pgsub cannot read.

    ``problem`` never carries the value itself (logs must not leak row data).
    """

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


def readable(column_type: ColumnType) -> bool:
    """Whether pgsub reads this column's binary form."""
    oid = column_type.wire_oid
    return oid in _FIXED or oid in _TEXTUAL or oid in _SCALAR_READERS


def to_arrow(values: Values, column_type: ColumnType, target: pa.DataType) -> pa.Array:
    """The Arrow column ``target`` of binary-format ``values`` (None for NULL)."""
    if not readable(column_type):
        raise BinaryValueError(
            f"pgsub has no binary reader for type OID {column_type.wire_oid} and was not given "
            "the publisher's text form of these values (a pgsub bug: apply.core.rendering turns "
            "them into text first); binary: false for this subscription avoids it"
        )
    raw = values if isinstance(values, pa.Array) else pa.array(values, type=pa.binary())
    if column_type.is_array:
        return _arrays(raw.to_pylist(), column_type, target)
    oid = column_type.wire_oid
    if oid in _FIXED:
        return _fixed(raw, oid, target)
    if oid in _TEXTUAL:
        try:
            text: pa.Array = raw.cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise BinaryValueError("a value that is not valid UTF-8 text") from exc
        return text
    if oid == typemap.BYTEA:
        return raw.cast(pa.binary())
    read = _scalar(column_type)
    return pa.array([None if v is None else read(v) for v in raw.to_pylist()], type=target)


def _fixed(raw: pa.Array, oid: int, target: pa.DataType) -> pa.Array:
    """A fixed-width column, a numpy operation per step for all its values."""
    big_endian, _ = _FIXED[oid]
    width = np.dtype(big_endian).itemsize
    count = len(raw)
    valid: npt.NDArray[np.bool_] = np.asarray(raw.is_valid(), dtype=np.bool_)
    buffers = raw.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=count + 1, offset=raw.offset * 4)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.empty(0)
    starts = offsets[:-1][valid]
    if np.any(offsets[1:][valid] - starts != width):
        raise BinaryValueError(f"a binary value that is not {width} bytes long")
    gathered = data[starts[:, None] + np.arange(width)].reshape(-1) if len(starts) else data[:0]
    decoded = np.frombuffer(gathered.tobytes(), dtype=big_endian)
    if oid == typemap.DATE:
        _check_range(decoded, _INT32, _MIN_DAYS, _MAX_DAYS, "date")
        decoded = decoded.astype(np.int32) + _EPOCH_DAYS
    elif oid in (typemap.TIMESTAMP, typemap.TIMESTAMPTZ):
        kind = "timestamp" if oid == typemap.TIMESTAMP else "timestamptz"
        _check_range(decoded, _INT64, _MIN_US, _MAX_US, kind)
        decoded = decoded.astype(np.int64) + _EPOCH_US
    elif oid == typemap.BOOL:
        decoded = decoded != 0
    else:
        decoded = decoded.astype(np.dtype(big_endian).newbyteorder("="))
    full = np.zeros(count, dtype=decoded.dtype)
    full[valid] = decoded
    return pa.array(full, type=target, mask=~valid)


def _check_range(
    values: npt.NDArray[Any], limits: tuple[int, int], low: int, high: int, kind: str
) -> None:
    if not len(values):
        return
    if np.any(values == limits[1]):
        raise BinaryValueError(f"infinity has no {kind} representation")
    if np.any(values == limits[0]):
        raise BinaryValueError(f"-infinity has no {kind} representation")
    if np.any(values < low):
        raise BinaryValueError(f"a BC date is outside {kind}'s range (years 1 to 9999)")
    if np.any(values > high):
        raise BinaryValueError(f"a year after 9999 is outside {kind}'s range")


# --- one value at a time: numeric, text forms, array elements ------------------------------


def numeric_text(value: bytes) -> str:
    """numeric's binary form as numeric_out writes it (exactly ``dscale`` decimals)."""
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", value)
    if sign == _NUMERIC_NAN:
        return "NaN"
    if sign == _NUMERIC_PINF:
        return "Infinity"
    if sign == _NUMERIC_NINF:
        return "-Infinity"
    digits = "".join(f"{d:04d}" for d in struct.unpack_from(f"!{ndigits}h", value, 8))
    point = (weight + 1) * 4
    if point <= 0:
        whole, fraction = "0", "0" * -point + digits
    elif point >= len(digits):
        whole, fraction = digits + "0" * (point - len(digits)), ""
    else:
        whole, fraction = digits[:point], digits[point:]
    whole = whole.lstrip("0") or "0"
    text = whole + ("." + (fraction + "0" * dscale)[:dscale] if dscale > 0 else "")
    return ("-" if sign == _NUMERIC_NEG and ndigits else "") + text


def _numeric_decimal(column_type: ColumnType) -> Callable[[bytes], Decimal]:
    kind = column_type.spark_type

    def read(value: bytes) -> Decimal:
        text = numeric_text(value)
        if text == "NaN":
            raise BinaryValueError(f"NaN has no {kind} representation")
        if text.endswith("Infinity"):
            raise BinaryValueError(f"{text} has no {kind} representation")
        return Decimal(text)

    return read


def _seconds(micros: int) -> str:
    """AppendSeconds: two digits, then the fraction without trailing zeros."""
    whole, fraction = divmod(abs(micros), 1_000_000)
    text = f"{whole:02d}"
    return text + f".{fraction:06d}".rstrip("0") if fraction else text


def time_text(micros: int) -> str:
    hours, rest = divmod(micros, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    return f"{hours:02d}:{minutes:02d}:{_seconds(rest)}"


def zone_text(seconds_west: int) -> str:
    """EncodeTimezone: +HH, +HH:MM or +HH:MM:SS east of UTC."""
    east = -seconds_west
    hours, rest = divmod(abs(east), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{'-' if east < 0 else '+'}{hours:02d}"
    if minutes or seconds:
        text += f":{minutes:02d}"
    if seconds:
        text += f":{seconds:02d}"
    return text


def _trunc_div(a: int, b: int) -> tuple[int, int]:
    """C's division: toward zero, remainder with the dividend's sign."""
    quotient = abs(a) // b * (1 if a >= 0 else -1)
    return quotient, a - quotient * b


def interval_text(micros: int, days: int, months: int) -> str:
    """interval_out with IntervalStyle postgres (EncodeInterval, INTSTYLE_POSTGRES)."""
    if (micros, days, months) == (_INT64[1], _INT32[1], _INT32[1]):
        return "infinity"
    if (micros, days, months) == (_INT64[0], _INT32[0], _INT32[0]):
        return "-infinity"
    years, months = _trunc_div(months, 12)
    hours, rest = _trunc_div(micros, 3_600_000_000)
    minutes, rest = _trunc_div(rest, 60_000_000)
    parts: list[str] = []
    is_before = False
    for value, unit in ((years, "year"), (months, "mon"), (days, "day")):
        if value == 0:
            continue
        plus = "+" if is_before and value > 0 else ""
        parts.append(f"{plus}{value} {unit}{'' if value == 1 else 's'}")
        is_before = value < 0
    if not parts or hours or minutes or rest:
        minus = hours < 0 or minutes < 0 or rest < 0
        sign = "-" if minus else "+" if is_before else ""
        parts.append(f"{sign}{abs(hours):02d}:{abs(minutes):02d}:{_seconds(rest)}")
    return " ".join(parts)


def _char_text(value: bytes) -> str:
    """ "char": one byte; charout writes a high-bit byte as \\ooo and NUL as nothing."""
    if not value or value[0] == 0:
        return ""
    return f"\\{value[0]:03o}" if value[0] >= 0x80 else chr(value[0])


def _uuid_text(value: bytes) -> str:
    h = value.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _interval(value: bytes) -> str:
    micros, days, months = struct.unpack("!qii", value)
    return interval_text(micros, days, months)


def _timetz(value: bytes) -> str:
    micros, zone = struct.unpack("!qi", value)
    return time_text(micros) + zone_text(zone)


def _text(value: bytes) -> str:
    return value.decode()


def _jsonb(value: bytes) -> str:
    if value[:1] != b"\x01":
        raise BinaryValueError("a jsonb value of an unknown binary version")
    return value[1:].decode()


_SCALAR_READERS: Final[dict[int, Callable[[bytes], Any]]] = {
    typemap.NUMERIC: numeric_text,
    typemap.UUID: _uuid_text,
    typemap.TIME: lambda v: time_text(struct.unpack("!q", v)[0]),
    typemap.TIMETZ: _timetz,
    typemap.INTERVAL: _interval,
    typemap.JSONB: _jsonb,
    typemap.CHAR: _char_text,
    typemap.BYTEA: bytes,
}


def _scalar(column_type: ColumnType) -> Callable[[bytes], Any]:
    if column_type.wire_oid == typemap.NUMERIC and not column_type.text_form:
        return _numeric_decimal(column_type)
    return _SCALAR_READERS[column_type.wire_oid]


def _arrays(
    values: Sequence[bytes | None], column_type: ColumnType, target: pa.DataType
) -> pa.Array:
    """array_send's form: dimensions, flags, element type, bounds, then (length, bytes)s.

    The elements of every array are read together, as a column of their own type."""
    elements: list[bytes | None] = []
    offsets = [0]
    for value in values:
        if value is not None:
            ndim = struct.unpack_from("!i", value)[0]
            if ndim > 1:
                raise BinaryValueError("a multidimensional array has no array<> representation")
            count = struct.unpack_from("!i", value, 12)[0] if ndim == 1 else 0
            position = 12 + 8 * ndim
            for _ in range(count):
                length = struct.unpack_from("!i", value, position)[0]
                position += 4
                elements.append(None if length < 0 else value[position : position + length])
                position += max(length, 0)
        offsets.append(len(elements))
    element_type = ColumnType(column_type.oid, column_type.typmod, False, column_type.binary_oid)
    read = to_arrow(elements, element_type, target.value_type)
    missing = pa.array([value is None for value in values], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), read, target, mask=missing)
