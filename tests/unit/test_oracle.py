"""The oracle must fail on the smallest difference, or every other test is void."""

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

from apply.columns import typemap
from tests.support.oracle import Column, compare_rows

COLS = [Column("id", typemap.INT8, -1), Column("v", typemap.TEXT, -1)]


def test_equal_tables_give_no_diff() -> None:
    rows = [(1, "a"), (2, "b"), (2, "b")]
    assert not compare_rows(rows, list(reversed(rows)), COLS)


def test_single_changed_cell_is_named() -> None:
    diff = compare_rows([(1, "a"), (2, "b")], [(1, "a"), (2, "X")], COLS, key=["id"])
    assert diff
    assert len(diff.changed) == 1
    _expected, _actual, cells = diff.changed[0]
    assert cells == ["v"]
    assert "changed: v" in diff.report()
    assert not diff.missing and not diff.extra


def test_single_changed_cell_without_key_shows_both_rows() -> None:
    diff = compare_rows([(1, "a"), (2, "b")], [(1, "a"), (2, "X")], COLS)
    assert len(diff.missing) == 1 and len(diff.extra) == 1
    assert "'b'" in diff.report() and "'X'" in diff.report()


def test_missing_duplicate_row_is_a_difference() -> None:
    diff = compare_rows([(1, "a"), (1, "a")], [(1, "a")], COLS)
    assert diff
    assert len(diff.missing) == 1
    assert "missing from delta" in diff.report()


def test_extra_row_is_a_difference() -> None:
    diff = compare_rows([(1, "a")], [(1, "a"), (3, "c")], COLS)
    assert diff
    assert len(diff.extra) == 1
    assert "extra in delta" in diff.report()


def test_null_differs_from_empty_string() -> None:
    assert compare_rows([(1, None)], [(1, "")], COLS)


def test_nan_equals_nan_and_differs_from_number() -> None:
    cols = [Column("f", typemap.FLOAT8, -1)]
    assert not compare_rows([(float("nan"),)], [(float("nan"),)], cols)
    assert compare_rows([(float("nan"),)], [(0.0,)], cols)
    assert not compare_rows([(float("inf"),)], [(float("inf"),)], cols)
    assert compare_rows([(float("inf"),)], [(float("-inf"),)], cols)


def test_float4_compared_at_float4_precision() -> None:
    cols = [Column("f", typemap.FLOAT4, -1)]
    assert not compare_rows([(1.1,)], [(1.100000023841858,)], cols)
    assert compare_rows([(1.1,)], [(1.2,)], cols)


def test_numeric_compared_by_value() -> None:
    cols = [Column("n", typemap.NUMERIC, (10 << 16 | 2) + 4)]
    assert not compare_rows([(Decimal("1.50"),)], [(Decimal("1.5"),)], cols)
    assert compare_rows([(Decimal("1.50"),)], [(Decimal("1.51"),)], cols)


def test_timestamptz_compared_as_instants() -> None:
    cols = [Column("ts", typemap.TIMESTAMPTZ, -1)]
    berlin = timezone(timedelta(hours=1))
    local = datetime(2024, 1, 1, 13, 0, tzinfo=berlin)
    utc = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
    assert not compare_rows([(local,)], [(utc,)], cols)
    assert compare_rows([(local,)], [(utc + timedelta(microseconds=1),)], cols)


def test_timestamp_and_timestamptz_are_not_mixed_up() -> None:
    cols = [Column("ts", typemap.TIMESTAMP, -1)]
    naive = datetime(2024, 1, 1, 12, 0)
    assert compare_rows([(naive,)], [(naive.replace(tzinfo=UTC),)], cols)


def test_bool_is_not_an_integer() -> None:
    cols = [Column("b", typemap.BOOL, -1)]
    assert compare_rows([(True,)], [(1,)], cols)


def test_arrays_compared_element_by_element() -> None:
    cols = [Column("a", 1007, -1)]
    assert not compare_rows([([1, None, 3],)], [((1, None, 3),)], cols)
    assert compare_rows([([1, 2, 3],)], [([1, 3, 2],)], cols)


def test_bytes_and_memoryview_compare_by_content() -> None:
    cols = [Column("b", typemap.BYTEA, -1)]
    assert not compare_rows([(memoryview(b"\x00\x01"),)], [(b"\x00\x01",)], cols)
    assert compare_rows([(b"\x00",)], [(b"\x01",)], cols)
