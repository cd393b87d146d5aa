"""apply.columns.binary: PostgreSQL's binary forms to the Arrow values of text mode.

The forms are built here with struct as PostgreSQL's send functions write
them; tests/integration/apply/test_apply_scenarios.py checks the same
against a real publisher, every type, beside text mode.
"""

from __future__ import annotations

import struct
from datetime import date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from apply.batching.collapse import MultisetNet, MultisetRow
from apply.batching.source import multiset_source
from apply.columns import typemap
from apply.columns.binary import (
    BinaryValueError,
    interval_text,
    numeric_text,
    readable,
    time_text,
    to_arrow,
    zone_text,
)
from apply.columns.columnar import ValueConversionError, arrow_type
from apply.columns.columnar import to_arrow as column_to_arrow
from apply.columns.schema import target_schema
from apply.columns.typemap import ColumnType
from subscriber.replication.messages import BINARY, TEXT, ReplicaIdentity, TupleData
from tests.unit.apply.builders import relation

PG_EPOCH = datetime(2000, 1, 1)


def numeric(digits: list[int], weight: int, dscale: int, sign: int = 0) -> bytes:
    return struct.pack(f"!hhHh{len(digits)}h", len(digits), weight, sign, dscale, *digits)


def convert(values: list[bytes | None], column_type: ColumnType) -> list[object]:
    return to_arrow(values, column_type, arrow_type(column_type)).to_pylist()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("form", "text"),
    [
        (numeric([1234, 5678], 0, 4), "1234.5678"),
        (numeric([12, 3000], 0, 2), "12.30"),
        (numeric([5000], -1, 1, 0x4000), "-0.5"),
        (numeric([123], -1, 6), "0.012300"),
        (numeric([1], 5, 0), "100000000000000000000"),
        (numeric([], 0, 3), "0.000"),
        (numeric([], 0, 0), "0"),
        (numeric([1], -5, 20), "0.00000000000000000001"),
        (numeric([], 0, 0, 0xC000), "NaN"),
        (numeric([], 0, 0, 0xD000), "Infinity"),
        (numeric([], 0, 0, 0xF000), "-Infinity"),
    ],
)
def test_numeric_as_numeric_out_writes_it(form: bytes, text: str) -> None:
    assert numeric_text(form) == text


@pytest.mark.parametrize(
    ("micros", "days", "months", "text"),
    [
        (0, 0, 0, "00:00:00"),
        (
            -(4 * 3600 + 5 * 60 + 6) * 10**6 - 500_000,
            3,
            -14,
            "-1 years -2 mons +3 days -04:05:06.5",
        ),
        (0, -1, 1, "1 mon -1 days"),
        (-1, 0, 0, "-00:00:00.000001"),
        (-(10**6), 1, -1, "-1 mons +1 day -00:00:01"),
        (10**6, 2, 12, "1 year 2 days 00:00:01"),
        (0, -3, 0, "-3 days"),
        (-250_000, 0, 24, "2 years -00:00:00.25"),
        (90 * 3600 * 10**6, 0, 0, "90:00:00"),
        (2**63 - 1, 2**31 - 1, 2**31 - 1, "infinity"),
    ],
)
def test_interval_as_intervalstyle_postgres(micros: int, days: int, months: int, text: str) -> None:
    assert interval_text(micros, days, months) == text


def test_time_and_zone_forms() -> None:
    assert time_text(0) == "00:00:00"
    assert time_text(24 * 3600 * 10**6) == "24:00:00"
    assert time_text((12 * 3600 + 34 * 60 + 56) * 10**6 + 789_000) == "12:34:56.789"
    assert time_text(1) == "00:00:00.000001"
    assert zone_text(-7200) == "+02"  # timetz keeps seconds west of UTC
    assert zone_text(0) == "+00"
    assert zone_text(5 * 3600 + 30 * 60 + 15) == "-05:30:15"
    assert zone_text(-(5 * 3600 + 30 * 60)) == "+05:30"


def test_fixed_width_columns_with_nulls_decode_a_column_at_a_time() -> None:
    ints = [struct.pack("!i", v) for v in (1, -1, 2**31 - 1)]
    assert convert([ints[0], None, ints[1], ints[2]], ColumnType(typemap.INT4)) == [
        1, None, -1, 2**31 - 1,
    ]  # fmt: skip
    assert convert([struct.pack("!h", -32768)], ColumnType(typemap.INT2)) == [-32768]
    assert convert([b"\x01", b"\x00", None], ColumnType(typemap.BOOL)) == [True, False, None]
    floats = convert([struct.pack("!d", 0.1), None], ColumnType(typemap.FLOAT8))
    assert floats == [0.1, None]
    day = struct.pack("!i", -1)
    assert convert([day], ColumnType(typemap.DATE)) == [date(1999, 12, 31)]
    at = struct.pack("!q", 1_500_000)
    assert convert([at], ColumnType(typemap.TIMESTAMP)) == [PG_EPOCH + timedelta(seconds=1.5)]
    # A column sliced out of a larger array (offset != 0) reads its own values.
    sliced = pa.array([struct.pack("!q", 1), struct.pack("!q", 2)], type=pa.binary()).slice(1)
    assert to_arrow(sliced, ColumnType(typemap.INT8), pa.int64()).to_pylist() == [2]


def test_what_text_mode_refuses_binary_mode_refuses_too() -> None:
    date_type = ColumnType(typemap.DATE)
    with pytest.raises(ValueConversionError, match="infinity has no date representation"):
        column_to_arrow([struct.pack("!i", 2**31 - 1)], date_type, "day", binary=True)
    with pytest.raises(ValueConversionError, match="BC date"):
        column_to_arrow([struct.pack("!i", -800_000)], date_type, "day", binary=True)
    price = ColumnType(typemap.NUMERIC, (12 << 16 | 2) + 4)
    with pytest.raises(ValueConversionError, match="NaN has no decimal"):
        column_to_arrow([numeric([], 0, 0, 0xC000)], price, "amount", binary=True)
    with pytest.raises(ValueConversionError, match="more digits"):
        column_to_arrow([numeric([1], 5, 0)], price, "amount", binary=True)
    with pytest.raises(ValueConversionError, match="not 4 bytes long"):
        column_to_arrow([b"\x00\x01"], ColumnType(typemap.INT4), "n", binary=True)
    with pytest.raises(ValueConversionError, match="multidimensional"):
        two_dims = struct.pack("!iiIiiii", 2, 0, 23, 1, 1, 1, 1)
        column_to_arrow([two_dims], ColumnType(typemap.INT4, is_array=True), "a", binary=True)


def test_decimal_text_forms_and_arrays() -> None:
    price = ColumnType(typemap.NUMERIC, (12 << 16 | 2) + 4)
    assert convert([numeric([12, 3000], 0, 2)], price) == [Decimal("12.30")]
    assert convert([b'\x01{"a": 1}'], ColumnType(typemap.JSONB)) == ['{"a": 1}']
    assert convert([bytes(range(16))], ColumnType(typemap.UUID)) == [
        "00010203-0405-0607-0809-0a0b0c0d0e0f"
    ]
    assert convert([b"\xe9", b"a", b"\x00"], ColumnType(typemap.CHAR)) == ["\\351", "a", ""]
    # int4[]: 1 dimension, a NULL among them, element type 23, 3 elements from 1.
    elements = struct.pack("!i", 4) + struct.pack("!i", 7) + struct.pack("!i", -1)
    elements += struct.pack("!i", 4) + struct.pack("!i", -7)
    array = struct.pack("!iiIii", 1, 1, 23, 3, 1) + elements
    assert convert([array, None], ColumnType(typemap.INT4, is_array=True)) == [[7, None, -7], None]
    empty = struct.pack("!iiI", 0, 0, 25)
    assert convert([empty], ColumnType(typemap.TEXT, is_array=True)) == [[]]


def test_types_without_a_reader_are_named_not_guessed() -> None:
    composite = ColumnType(typemap.TEXT, binary_oid=16500)
    assert not readable(composite)
    assert readable(ColumnType(typemap.TEXT))  # an enum: its label
    with pytest.raises(BinaryValueError, match=r"OID 16500.*binary: false"):
        to_arrow([b"\x00"], composite, pa.string())
    inet = ColumnType(869)
    with pytest.raises(ValueConversionError, match="OID 869"):
        column_to_arrow([b"\x02\x20\x00\x04\x0a\x00\x00\x01"], inet, "addr", binary=True)


def test_a_batch_holding_both_formats_of_a_column_reads_each_value_in_its_own() -> None:
    """binary turned on between two transactions of one batch (a prepared transaction staged
    in text mode, committed in binary mode): each value is read in the format it came in."""
    rel = relation("id", "v", key=(), identity=ReplicaIdentity.FULL)
    as_text = TupleData(bytes([TEXT, TEXT]), (b"1", b"a"))
    as_binary = TupleData(bytes([BINARY, BINARY]), (struct.pack("!i", 2), b"b"))
    rows = {image: MultisetRow(image, 1, 0) for image in (as_text, as_binary)}
    source = multiset_source(MultisetNet(rel, rows=rows), target_schema(rel, lambda _: None, False))
    assert sorted(zip(*source.inserts.to_pydict().values(), strict=True)) == [(1, "a"), (2, "b")]
