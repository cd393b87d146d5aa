"""The statistics of a data file pgsub's own commits add (the ``add`` action's ``stats``).

Delta's protocol lets a writer leave out any column's statistics, and Spark
reads a missing minimum as "unknown". delta-rs does not: once a file's
``minValues`` exists, its pyarrow dataset reads every column missing from it
as a null bound (``v >= null``), and a filter on that column skips the file -
rows that are there are not returned. So a file pgsub writes carries what
delta-rs's own writer would: the row count, and for every column of a type
delta-rs keeps statistics of (numbers, strings, booleans, dates, timestamps,
decimals, and the fields of a struct) its null count, and its minimum and
maximum unless every value is null. Binary, list and map columns get none, as
from delta-rs.

Bounds are bounds, never the values' rounding: a string longer than
``STRING_PREFIX`` characters is bounded by its prefix below and above by the
prefix with its last character grown by one;
a timestamp by its millisecond below and the next millisecond above. A
decimal is written exactly, in fixed notation. JSON has no infinity: the
largest double stands for it (a filter for an infinite value may skip the
file, as on delta-rs's own files; JSON's null there would make every filter
skip it).
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import math
import sys
from typing import Final, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

STRING_PREFIX: Final = 32  # characters of a string kept in a bound, as Spark's statistics
# Up to this many values a column's bounds are taken in Python (types whose Python order is
# Arrow's): an Arrow call a column cost more than a small table's batch of a few rows.
BOUNDS_IN_PYTHON: Final = 64
_LARGEST: Final = "\U0010ffff"  # the largest code point: a character that cannot grow
_SURROGATES: Final = (0xD800, 0xDFFF)

Bound: TypeAlias = "int | float | bool | str | _Exact | dict[str, Bound]"
Nulls: TypeAlias = "int | dict[str, Nulls]"


def _ordered_in_python(data_type: pa.DataType) -> bool:
    """Whether Python orders ``data_type``'s values (of a column with statistics) as Arrow's
    ``min_max`` does: not floats (NaN), not structs, not nanoseconds (no ``datetime``);
    strings by code point, which is UTF-8's byte order."""
    if pa.types.is_floating(data_type) or pa.types.is_struct(data_type):
        return False
    return not (pa.types.is_timestamp(data_type) and data_type.unit == "ns")


def kept(data_type: pa.DataType) -> bool:
    """Whether a column of ``data_type`` gets statistics (those delta-rs reads)."""
    if pa.types.is_struct(data_type):
        return True
    return bool(
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_boolean(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_date32(data_type)
        or pa.types.is_timestamp(data_type)
        or pa.types.is_decimal(data_type)
    )


class FileStats:
    """One file's statistics, gathered as its batches are written."""

    def __init__(self, schema: pa.Schema) -> None:
        self.rows = 0
        self._columns = [_Column(field.type) for field in schema]
        self._names = [field.name for field in schema]

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        for name, column in zip(self._names, self._columns, strict=True):
            column.add(batch.column(name))

    def json(self) -> str:
        low: dict[str, Bound] = {}
        high: dict[str, Bound] = {}
        nulls: dict[str, Nulls] = {}
        for name, column in zip(self._names, self._columns, strict=True):
            if not column.kept:
                continue
            nulls[name] = column.nulls()
            if (bounds := column.bounds()) is not None:
                low[name], high[name] = bounds
        return _exact_json(
            {"numRecords": self.rows, "minValues": low, "maxValues": high, "nullCount": nulls}
        )


def loosened(stats: str, rows: int) -> str:
    """``stats`` of a file added again with a deletion vector: ``numRecords`` its ``rows``,
    ``tightBounds`` false (its bounds may now be wider than its alive rows'), every bound
    kept as written. A decimal bound read as a double would lose digits - rounded up, a
    lower bound is no longer one, and a reader skipping files by it misses rows - and be
    written with an exponent, which delta-rs reads as null. Stats already so (a file's
    second vector on) are returned as they are."""
    if stats.startswith(f'{{"numRecords":{rows},') and stats.endswith(',"tightBounds":false}'):
        return stats
    parsed = json.loads(stats, parse_float=decimal.Decimal)
    parsed["numRecords"] = rows
    parsed["tightBounds"] = False
    return _exact_json(parsed, separators=(",", ":"))


def _exact_json(value: object, separators: tuple[str, str] | None = None) -> str:
    """``value`` as JSON, each decimal (``_Exact``, or read as ``decimal.Decimal``) a number
    in fixed notation with every digit."""
    exact: list[decimal.Decimal] = []

    def held(found: object) -> str:
        return _Exact.held(_Exact(found) if isinstance(found, decimal.Decimal) else found, exact)

    return _Exact.put(json.dumps(value, separators=separators, default=held), exact)


class _Exact:
    """A decimal bound, written as a JSON number in fixed notation, every digit kept (a
    double's rounding is no bound, and delta-rs reads no exponent: ``1E-9`` is null)."""

    _MARK: Final = "\ue000pgsub-decimal-{}\ue000"

    def __init__(self, value: decimal.Decimal) -> None:
        self.value = value

    @classmethod
    def held(cls, value: object, exact: list[decimal.Decimal]) -> str:
        if not isinstance(value, _Exact):
            raise TypeError(f"no statistics for a value of {type(value).__name__}")
        exact.append(value.value)
        return cls._MARK.format(len(exact) - 1)

    @classmethod
    def put(cls, written: str, exact: list[decimal.Decimal]) -> str:
        for index, value in enumerate(exact):
            quoted = json.dumps(cls._MARK.format(index))
            written = written.replace(quoted, format(value, "f"), 1)
        return written


class _Column:
    """The statistics of one column (of one field of a struct, recursively)."""

    def __init__(self, data_type: pa.DataType) -> None:
        self.type = data_type
        self.kept = kept(data_type)
        self._in_python = self.kept and _ordered_in_python(data_type)
        self._nulls = 0
        self._low: object = None
        self._high: object = None
        self._fields: dict[str, _Column] = {}
        if pa.types.is_struct(data_type):
            self._fields = {f.name: _Column(f.type) for f in data_type}

    def add(self, values: pa.Array | pa.ChunkedArray) -> None:
        if not self.kept:
            return
        self._nulls += values.null_count
        if self._fields:
            for name, field in self._fields.items():
                field.add(pc.struct_field(values, name))
            return
        if self._in_python and len(values) <= BOUNDS_IN_PYTHON:
            present = [value for value in values.to_pylist() if value is not None]
            if not present:
                return  # every value null: no bounds
            low, high = min(present), max(present)
        else:
            bounds = pc.min_max(values).as_py()
            if bounds["min"] is None or (
                isinstance(bounds["min"], float) and math.isnan(bounds["min"])
            ):
                return  # every value null (or NaN): no bounds
            low, high = bounds["min"], bounds["max"]
        self._low = low if self._low is None else min(self._low, low)
        self._high = high if self._high is None else max(self._high, high)

    def nulls(self) -> Nulls:
        if self._fields:
            return {name: f.nulls() for name, f in self._fields.items() if f.kept}
        return self._nulls

    def bounds(self) -> tuple[Bound, Bound] | None:
        if self._fields:
            low: dict[str, Bound] = {}
            high: dict[str, Bound] = {}
            for name, field in self._fields.items():
                if field.kept and (bounds := field.bounds()) is not None:
                    low[name], high[name] = bounds
            return (low, high) if low else None
        if self._low is None:
            return None
        return _below(self.type, self._low), _above(self.type, self._high)


def _below(data_type: pa.DataType, value: object) -> Bound:
    """A value no larger than ``value``, as Delta's statistics write it."""
    if isinstance(value, str):
        return value[:STRING_PREFIX]
    if isinstance(value, datetime.datetime):
        return _timestamp(data_type, value.replace(microsecond=value.microsecond // 1000 * 1000))
    return _plain(value)


def _above(data_type: pa.DataType, value: object) -> Bound:
    """A value no smaller than ``value``, as Delta's statistics write it."""
    if isinstance(value, str):
        return _string_above(value)
    if isinstance(value, datetime.datetime):
        floor = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if floor != value:
            with contextlib.suppress(OverflowError):  # the last millisecond of year 9999
                floor += datetime.timedelta(milliseconds=1)
        return _timestamp(data_type, floor)
    return _plain(value)


def _string_above(value: str) -> str:
    """The shortest bound of at most ``STRING_PREFIX`` characters no smaller than ``value``:
    its prefix with the last character that can grow grown by one (code point order, which
    is UTF-8's byte order); ``value`` itself if it is short or no character can grow."""
    if len(value) <= STRING_PREFIX:
        return value
    head = value[:STRING_PREFIX].rstrip(_LARGEST)
    if not head:
        return value
    grown = ord(head[-1]) + 1
    if _SURROGATES[0] <= grown <= _SURROGATES[1]:  # not characters: the next one is
        grown = _SURROGATES[1] + 1
    return head[:-1] + chr(grown)


def _timestamp(data_type: pa.DataType, value: datetime.datetime) -> str:
    """A timestamp as delta-rs writes it in statistics: UTC with ``Z``, or (without a time
    zone) as written on the wall, to the millisecond."""
    if data_type.tz is not None:
        utc = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return utc.isoformat(timespec="milliseconds") + "Z"
    return value.isoformat(sep=" ", timespec="milliseconds")


def _plain(value: object) -> Bound:
    if isinstance(value, decimal.Decimal):
        return _Exact(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, float):  # JSON has no infinity: the largest double bounds it
        return max(-sys.float_info.max, min(value, sys.float_info.max))
    if isinstance(value, bool | int):
        return value
    raise TypeError(f"no statistics for a value of {type(value).__name__}")
