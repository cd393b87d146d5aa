"""The rows of files pgsub's own writer just wrote, kept within a budget (kept_rows.py)."""

from __future__ import annotations

import pyarrow as pa

from apply.delta.writer.kept_rows import LARGEST, KeptRows


def rows(n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(n), pa.int64())})


def test_kept_rows_are_found_by_table_and_file() -> None:
    kept = KeptRows()
    kept.keep("s3://b/t", "a.parquet", rows(3))
    assert kept.get("s3://b/t", "a.parquet") == rows(3)
    assert kept.get("s3://b/u", "a.parquet") is None  # another table's file of that name
    assert kept.get("s3://b/t", "b.parquet") is None


def test_the_least_recently_used_go_first_past_the_budget() -> None:
    kept = KeptRows(budget=rows(100).nbytes * 2)
    kept.keep("t", "a", rows(100))
    kept.keep("t", "b", rows(100))
    assert kept.get("t", "a") is not None  # a used last: b goes first
    kept.keep("t", "c", rows(100))
    assert kept.get("t", "b") is None
    assert kept.get("t", "a") is not None and kept.get("t", "c") is not None
    assert kept.bytes <= kept.budget


def test_a_file_larger_than_a_kept_one_may_be_is_not_kept() -> None:
    kept = KeptRows(budget=LARGEST * 4)
    big = rows(LARGEST // 8 + 1)  # 8 bytes a row
    kept.keep("t", "big", big)
    assert kept.get("t", "big") is None
    assert kept.bytes == 0


def test_a_file_kept_again_counts_once() -> None:
    kept = KeptRows()
    kept.keep("t", "a", rows(10))
    kept.keep("t", "a", rows(10))
    assert kept.bytes == rows(10).nbytes


def test_files_that_left_their_table_are_forgotten_at_once() -> None:
    kept = KeptRows()
    kept.keep("t", "a", rows(10))
    kept.keep("t", "b", rows(10))
    kept.keep("u", "a", rows(10))
    kept.forget("t", ["a", "never-kept"])
    assert kept.get("t", "a") is None
    assert kept.get("t", "b") is not None and kept.get("u", "a") is not None
    assert kept.bytes == 2 * rows(10).nbytes
