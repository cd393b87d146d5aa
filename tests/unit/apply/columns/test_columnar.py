"""Text-format values to Arrow, per the type mapping; bad values name the column, not the value."""

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from apply.columns import typemap
from apply.columns.columnar import ValueConversionError, ValueParseError, to_arrow
from apply.columns.typemap import ColumnType

NUM_12_2 = ((12 << 16) | 2) + 4


@pytest.mark.parametrize(
    ("column_type", "values", "expected"),
    [
        (ColumnType(typemap.BOOL), [b"t", b"f", None], [True, False, None]),
        (ColumnType(typemap.INT2), [b"-32768", b"7"], [-32768, 7]),
        (ColumnType(typemap.INT8), [b"9223372036854775807"], [9223372036854775807]),
        (ColumnType(typemap.FLOAT8), [b"1.5", b"-Infinity"], [1.5, float("-inf")]),
        (
            ColumnType(typemap.NUMERIC, NUM_12_2),
            [b"12.34", b"-0.01"],
            [Decimal("12.34"), Decimal("-0.01")],
        ),
        (ColumnType(typemap.NUMERIC), [b"NaN", b"1e-40"], ["NaN", "1e-40"]),
        (ColumnType(typemap.BYTEA), [b"\\x00ff", None], [b"\x00\xff", None]),
        (ColumnType(typemap.DATE), [b"2024-02-29"], [dt.date(2024, 2, 29)]),
        (
            ColumnType(typemap.TIMESTAMP),
            [b"2024-01-01 01:02:03.5"],
            [dt.datetime(2024, 1, 1, 1, 2, 3, 500000)],
        ),
        (
            ColumnType(typemap.TIMESTAMPTZ),
            [b"2024-01-01 01:02:03+00"],
            [dt.datetime(2024, 1, 1, 1, 2, 3, tzinfo=dt.UTC)],
        ),
        (ColumnType(typemap.INTERVAL), [b"1 day 02:00:00"], ["1 day 02:00:00"]),
        (ColumnType(typemap.INT4, is_array=True), [b"{1,NULL,3}", None], [[1, None, 3], None]),
        (ColumnType(typemap.TEXT, is_array=True), [b'{a,"b c",NULL}'], [["a", "b c", None]]),
    ],
)
def test_values_convert(
    column_type: ColumnType, values: list[bytes | None], expected: list[object]
) -> None:
    array = to_arrow(values, column_type, "c")
    got = array.to_pylist()
    if pa.types.is_float64(array.type):
        assert [str(v) for v in got] == [str(v) for v in expected]
    elif pa.types.is_timestamp(array.type) and array.type.tz:
        assert [v.astimezone(dt.UTC) for v in got] == expected
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("column_type", "value", "problem"),
    [
        (ColumnType(typemap.DATE), b"infinity", "infinity has no date representation"),
        (ColumnType(typemap.TIMESTAMP), b"10000-01-01 00:00:00", "year after 9999"),
        (ColumnType(typemap.DATE), b"0044-03-15 BC", "BC date"),
        (ColumnType(typemap.NUMERIC, NUM_12_2), b"NaN", "NaN has no decimal(12,2)"),
        (ColumnType(typemap.INT4, is_array=True), b"{{1,2},{3,4}}", "multidimensional"),
        (ColumnType(typemap.DATE, is_array=True), b"{infinity}", "infinite element"),
    ],
)
def test_values_the_target_cannot_hold_are_errors(
    column_type: ColumnType, value: bytes, problem: str
) -> None:
    with pytest.raises(ValueConversionError) as err:
        to_arrow(
            [
                b"2024-01-01"
                if column_type.oid == typemap.DATE and not column_type.is_array
                else None,
                value,
            ],
            column_type,
            "when",
        )
    assert "'when'" in str(err.value) and problem in str(err.value)
    assert value.decode() not in str(err.value) or value in (b"infinity", b"NaN")


@pytest.mark.parametrize(
    ("column_type", "value", "problem"),
    [
        (ColumnType(typemap.BYTEA), b"abc", "not hex bytea"),  # bytea_output = escape
        (ColumnType(typemap.DATE), b"31/12/2024", "not date text"),  # DateStyle = 'SQL, DMY'
        (ColumnType(typemap.TEXT), b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_a_value_pgsub_fails_to_read_is_named_as_pgsubs_error(
    column_type: ColumnType, value: bytes, problem: str
) -> None:
    """Not advice to change the publisher's data: PostgreSQL wrote a valid value."""
    with pytest.raises(ValueParseError) as err:
        to_arrow([value], column_type, "c")
    message = str(err.value)
    assert problem in message and f"type OID {column_type.oid}" in message
    assert "pgsub's error, not the data's" in message and "text format" in message
    assert "change the column on the publisher" not in message
    assert value.decode(errors="replace") not in message  # no row values in logs


def test_a_binary_value_pgsub_fails_to_read_names_the_binary_format() -> None:
    with pytest.raises(ValueParseError, match=r"binary format.*binary: false"):
        to_arrow([b"\x00\x01"], ColumnType(typemap.INTERVAL), "span", binary=True)
