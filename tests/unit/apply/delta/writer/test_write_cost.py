"""What a batch writes (apply/delta/writer/write_cost.py): foreseen from the table's statistics
before it is written, counted from its commit's actions after."""

from __future__ import annotations

import json
from pathlib import Path

import deltalake
import pyarrow as pa

from apply.delta.writer.write_cost import commit_bytes, rewrite_bytes, row_bytes


def _lines(*actions: dict[str, object]) -> list[str]:
    return [json.dumps(a) for a in actions]


def test_a_rewrite_counts_its_new_file_and_what_it_replaced() -> None:
    lines = _lines(
        {"commitInfo": {}},
        {"remove": {"path": "old.parquet", "size": 41_000_000}},
        {"add": {"path": "new.parquet", "size": 41_000_100}},
    )
    counted = commit_bytes(lines)
    assert counted.written == 41_000_100 + sum(len(line) + 1 for line in lines)
    assert counted.rewritten == 41_000_000


def test_a_vector_commit_counts_its_rows_and_vectors_not_the_files_it_marks() -> None:
    """A file added again with a new vector is not written again: only the batch's new
    file, its vector file (once, whatever the vectors in it) and the commit count."""
    vector = {"storageType": "u", "pathOrInlineDv": "ab" * 10, "sizeInBytes": 30}
    lines = _lines(
        {"remove": {"path": "big.parquet", "size": 41_000_000}},
        {
            "add": {
                "path": "big.parquet",
                "size": 41_000_000,
                "deletionVector": {**vector, "offset": 1},
            }
        },
        {"remove": {"path": "two.parquet", "size": 9_000_000}},
        {
            "add": {
                "path": "two.parquet",
                "size": 9_000_000,
                "deletionVector": {**vector, "offset": 39},
            }
        },
        {"add": {"path": "rows.parquet", "size": 1_500}},
    )
    counted = commit_bytes(lines)
    assert counted.written == 1_500 + (39 + 4 + 30 + 4) + sum(len(line) + 1 for line in lines)
    assert counted.rewritten == 0


def test_the_files_a_batch_would_rewrite_are_those_whose_key_range_holds_its_keys(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "t")
    for low in (0, 1000, 2000):  # three files of a thousand keys each
        ids = pa.array(range(low, low + 1000), pa.int64())
        deltalake.write_deltalake(path, pa.table({"id": ids, "v": ["x"] * 1000}), mode="append")
    table = deltalake.DeltaTable(path)
    actions = pa.table(table.get_add_actions(flatten=True))
    size = dict(zip(actions["min.id"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True))
    assert rewrite_bytes(table, "id", pa.array([5, 10], pa.int64())) == size[0]
    assert rewrite_bytes(table, "id", pa.array([5, 2500], pa.int64())) == size[0] + size[2000]
    assert rewrite_bytes(table, "id", pa.array([5000], pa.int64())) == 0  # a new key
    assert rewrite_bytes(table, "id", pa.array(["5"], pa.string())) == sum(size.values())
    assert 1 <= row_bytes(table) <= sum(size.values()) // 3000 + 1
