"""The statistics of the files pgsub's own commits add (apply/delta/writer/file_stats.py): a reader
that skips files by them (delta-rs's pyarrow dataset) finds every row by every column.

Statistics of integer columns only made delta-rs skip a file on a filter by any other
column (it reads a bound missing from ``minValues`` as null): a versions table copied by
pgsub's own commit found no current row of any key, and every update was update_missing."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from unittest.mock import patch

import deltalake
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from apply.core.records import CommitMark
from apply.delta.files.local_store import LocalStore
from apply.delta.writer import file_stats
from apply.delta.writer.file_stats import STRING_PREFIX, FileStats, loosened
from apply.delta.writer.open_table import OpenTable
from apply.delta.writer.overwrite import append, overwrite
from subscriber.replication.lsn import Lsn

MARK = CommitMark("sub1", Lsn(100), 0)
UTC = datetime.UTC
LONG = "p" * STRING_PREFIX
ROWS = pa.table(
    {
        "id": pa.array([1, 2, 3], pa.int64()),
        "small": pa.array([-5, 0, 7], pa.int16()),
        "v": pa.array(["a", LONG + "z" * 40, LONG + "\U0010ffff" + "q"], pa.string()),
        "flag": pa.array([True, True, None], pa.bool_()),
        "f": pa.array([1.5, float("nan"), float("inf")], pa.float64()),
        "d": pa.array(
            [decimal.Decimal("12345678901234567890.123456781"), decimal.Decimal("-1"), None],
            pa.decimal128(38, 9),
        ),
        "day": pa.array([datetime.date(2024, 2, 29), None, datetime.date(1970, 1, 1)]),
        "at": pa.array(
            [datetime.datetime(2024, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC)] * 2
            + [datetime.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC)],
            pa.timestamp("us", "UTC"),
        ),
        "wall": pa.array(
            [datetime.datetime(2024, 6, 1, 12, 0, 0, 500)] * 3,
            pa.timestamp("us"),
        ),
        "none": pa.array([None, None, None], pa.int64()),
        "blob": pa.array([b"x", None, b"y"], pa.binary()),
        "s": pa.array([{"a": 1, "z": "q"}, {"a": None, "z": "r"}, None]),
    }
)


def _written(tmp_path: Path, how: str) -> deltalake.DeltaTable:
    folder = str(tmp_path / "t")
    deltalake.write_deltalake(folder, ROWS.schema.empty_table())
    table = deltalake.DeltaTable(folder)
    store = LocalStore(folder)
    if how == "append":
        append(store, table.version(), ROWS.to_batches(max_chunksize=2), ROWS.schema, MARK)
    else:
        overwrite(store, table.version(), OpenTable(store, table).files(), ROWS, MARK)
    return deltalake.DeltaTable(folder)


@pytest.mark.parametrize("how", ["append", "overwrite"])
def test_every_row_is_found_by_every_column_through_the_files_statistics(
    tmp_path: Path, how: str
) -> None:
    table = _written(tmp_path, how)
    dataset = table.to_pyarrow_dataset()
    for column in ROWS.column_names:
        if column in ("s", "blob"):
            continue
        for value in ROWS.column(column).to_pylist():
            if value is None or (isinstance(value, float) and not math.isfinite(value)):
                continue  # JSON has no NaN nor infinity: a filter on them is one skipping hides
            found = dataset.to_table(filter=ds.field(column) == pa.scalar(value, ROWS[column].type))
            assert found.num_rows >= 1, (column, value)
    for name in ("a", "z"):
        found = dataset.to_table(filter=ds.field("s", name) == ROWS["s"][0].as_py()[name])
        assert found.num_rows == 1, name
    assert dataset.to_table(filter=ds.field("none").is_null()).num_rows == 3
    assert dataset.to_table(filter=ds.field("blob") == b"y").num_rows == 1


def test_bounds_hold_every_value_and_say_what_delta_rs_writes(tmp_path: Path) -> None:
    stats = FileStats(ROWS.schema)
    for batch in ROWS.to_batches(max_chunksize=1):
        stats.add(batch)
    written = json.loads(stats.json())
    low, high, nulls = written["minValues"], written["maxValues"], written["nullCount"]
    assert written["numRecords"] == 3
    assert (low["id"], high["id"], low["small"], high["small"]) == (1, 3, -5, 7)
    assert low["v"] == "a" and high["v"] == LONG[:-1] + "q"
    assert high["v"] >= max(ROWS["v"].to_pylist())
    assert (low["flag"], high["flag"], nulls["flag"]) == (True, True, 1)
    assert (low["f"], high["f"]) == (1.5, 1.7976931348623157e308)  # NaN ignored, inf bounded
    assert low["d"] <= -1 and high["d"] >= 12345678901234567890.123456781
    assert (low["day"], high["day"]) == ("1970-01-01", "2024-02-29")
    assert (low["at"], high["at"]) == ("2024-01-01T00:00:00.000Z", "2024-01-01T00:00:01.000Z")
    assert (low["wall"], high["wall"]) == ("2024-06-01 12:00:00.000", "2024-06-01 12:00:00.001")
    assert "none" not in low and nulls["none"] == 3
    assert "blob" not in low and "blob" not in nulls
    assert low["s"] == {"a": 1, "z": "q"} and high["s"] == {"a": 1, "z": "r"}
    assert nulls["s"] == {"a": 2, "z": 1}


def _random_rows(rng: random.Random, count: int) -> pa.Table:
    def column(value: Callable[[], object], type_: pa.DataType) -> pa.Array:
        return pa.array([None if rng.random() < 0.2 else value() for _ in range(count)], type_)

    def text() -> str:
        return "".join(rng.choice("aZ\u00e9\U0001f600") for _ in range(rng.randint(0, 40)))

    epoch = datetime.date(1970, 1, 1)
    return pa.table(
        {
            "id": column(lambda: rng.randint(-(2**62), 2**62), pa.int64()),
            "v": column(text, pa.string()),
            "flag": column(lambda: rng.random() < 0.5, pa.bool_()),
            "d": column(
                lambda: decimal.Decimal(rng.randint(-(10**20), 10**20)).scaleb(-2),
                pa.decimal128(38, 2),
            ),
            "day": column(lambda: epoch + datetime.timedelta(rng.randint(0, 40000)), pa.date32()),
            "at": column(lambda: rng.randint(0, 2**50), pa.int64()).cast(pa.timestamp("us", "UTC")),
        }
    )


@pytest.mark.parametrize("rows", [1, 8, 64])
def test_bounds_taken_in_python_are_arrows(rows: int) -> None:
    rng = random.Random(rows)
    for table in [ROWS, *(_random_rows(rng, rows) for _ in range(20))]:

        def written(in_python: int, table: pa.Table = table) -> str:
            with patch.object(file_stats, "BOUNDS_IN_PYTHON", in_python):
                stats = FileStats(table.schema)
                for batch in table.to_batches(max_chunksize=max(1, rows // 2)):
                    stats.add(batch)
                return stats.json()

        assert written(10**6) == written(-1)


def test_a_file_added_again_keeps_every_digit_and_says_its_bounds_are_loose() -> None:
    stats = FileStats(ROWS.schema)
    stats.add(ROWS.to_batches()[0])
    written = stats.json()
    again = loosened(written, 3)
    exact = json.loads(written, parse_float=decimal.Decimal)
    assert json.loads(again, parse_float=decimal.Decimal) == exact | {
        "numRecords": 3,
        "tightBounds": False,
    }
    assert "e+" not in again.lower() and "E-" not in again
    assert loosened(again, 3) is again  # a second vector: nothing to change
    assert json.loads(loosened(again, 5))["numRecords"] == 5
    assert loosened("{}", 2) == '{"numRecords":2,"tightBounds":false}'
