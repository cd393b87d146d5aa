"""The type mapping is a contract: every listed type maps as the table says."""

import pytest

from apply.columns import typemap
from apply.columns.typemap import NumericTypmod, spark_type


def numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


@pytest.mark.parametrize(
    ("oid", "expected"),
    [
        (typemap.BOOL, "boolean"),
        (typemap.INT2, "short"),
        (typemap.INT4, "int"),
        (typemap.INT8, "long"),
        (typemap.FLOAT4, "float"),
        (typemap.FLOAT8, "double"),
        (typemap.TEXT, "string"),
        (typemap.VARCHAR, "string"),
        (typemap.BPCHAR, "string"),
        (typemap.NAME, "string"),
        (typemap.BYTEA, "binary"),
        (typemap.UUID, "string"),
        (typemap.DATE, "date"),
        (typemap.TIMESTAMP, "timestamp_ntz"),
        (typemap.TIMESTAMPTZ, "timestamp"),
        (typemap.TIME, "string"),
        (typemap.TIMETZ, "string"),
        (typemap.INTERVAL, "string"),
        (typemap.JSON, "string"),
        (typemap.JSONB, "string"),
        (16_384, "string"),  # an enum, or an extension type such as citext
        (1007, "array<int>"),
        (1009, "array<string>"),
        (1185, "array<timestamp>"),
        (2951, "array<string>"),
    ],
)
def test_listed_types(oid: int, expected: str) -> None:
    assert spark_type(oid) == expected


def test_numeric_with_precision_up_to_38_is_decimal() -> None:
    assert spark_type(typemap.NUMERIC, numeric_typmod(10, 2)) == "decimal(10,2)"
    assert spark_type(typemap.NUMERIC, numeric_typmod(38, 0)) == "decimal(38,0)"
    assert spark_type(1231, numeric_typmod(12, 4)) == "array<decimal(12,4)>"


@pytest.mark.parametrize("typmod", [-1, numeric_typmod(39, 2), numeric_typmod(1000, 0)])
def test_numeric_without_typmod_or_too_wide_is_string(typmod: int) -> None:
    assert spark_type(typemap.NUMERIC, typmod) == "string"


def test_numeric_scale_outside_spark_range_is_string() -> None:
    # PostgreSQL 15 allows numeric(5,-2) and numeric(3,5); Spark does not.
    assert NumericTypmod.decode(numeric_typmod(5, -2)) == NumericTypmod(5, -2)
    assert spark_type(typemap.NUMERIC, numeric_typmod(5, -2)) == "string"
    assert spark_type(typemap.NUMERIC, numeric_typmod(3, 5)) == "string"


def test_text_form_columns() -> None:
    assert typemap.is_text_form(typemap.UUID)
    assert typemap.is_text_form(2951)
    assert not typemap.is_text_form(typemap.INT4)
    assert not typemap.is_text_form(typemap.NUMERIC, numeric_typmod(10, 2))
