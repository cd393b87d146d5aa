"""What a batch writes: foreseen before it is written, counted once it is committed.

Foreseen (``rewrite_bytes``, ``row_bytes``): what a batch would rewrite
without deletion vectors - every live file whose key range (its
statistics' minimum and maximum of the key's first column) holds one of
the batch's keys, the whole table when it is small enough to be rewritten
whole - and about how many bytes a row takes in the table's Parquet. With
them ``apply.core.features.write_gain`` decides whether the table gains
deletion vectors before the batch (a table rewritten whole each second for
ten changed rows was terabytes a day: docs/performance.md, "What a batch
writes").

Counted (``commit_bytes``): what a commit wrote - the data files it adds
(not a file added again with a new deletion vector), its vector files, the
commit file itself - and what it rewrote (the files it removes for good),
read from its actions. The apply worker counts both per table
(``pgsub_table_bytes_written_total``), beside the bytes of the rows the
batch changed, so that write amplification shows before the disk fills.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import deltalake

# A row's bytes in Parquet when the table's statistics do not say (no rows yet).
DEFAULT_ROW_BYTES: Final = 64


@dataclass(frozen=True, slots=True)
class CommitBytes:
    """What one commit wrote and rewrote, in bytes."""

    written: int  # new data files, vector files, the commit file
    rewritten: int  # live files it removed for good (their rows written again, or gone)


def commit_bytes(lines: list[str]) -> CommitBytes:
    """The bytes a commit (its actions, one JSON a line) wrote and rewrote."""
    actions = [json.loads(line) for line in lines if line]
    added = {str(a["add"]["path"]) for a in actions if "add" in a}
    removed = {str(a["remove"]["path"]) for a in actions if "remove" in a}
    written = sum(len(line) + 1 for line in lines)
    vector_files: dict[str, int] = {}
    rewritten = 0
    for action in actions:
        remove = action.get("remove")
        if isinstance(remove, dict) and str(remove["path"]) not in added:
            rewritten += int(remove.get("size") or 0)
        add = action.get("add")
        if not isinstance(add, dict):
            continue
        if str(add["path"]) not in removed:  # not the same file added again with a vector
            written += int(add.get("size") or 0)
        vector = add.get("deletionVector")
        if isinstance(vector, dict) and vector.get("storageType") != "i":
            name = str(vector["pathOrInlineDv"])
            end = int(vector.get("offset") or 1) + 4 + int(vector["sizeInBytes"]) + 4
            vector_files[name] = max(vector_files.get(name, 1), end)
    return CommitBytes(written + sum(vector_files.values()), rewritten)


def row_bytes(table: deltalake.DeltaTable) -> int:
    """About how many bytes of the table's Parquet a row takes, from its files' statistics."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if not actions.num_rows or "num_records" not in actions.column_names:
        return DEFAULT_ROW_BYTES
    rows = pc.sum(actions["num_records"]).as_py() or 0
    size = pc.sum(actions["size_bytes"]).as_py() or 0
    return max(1, size // rows) if rows else DEFAULT_ROW_BYTES


def rewrite_bytes(table: deltalake.DeltaTable, key: str, keys: pa.Array) -> int:
    """The bytes of the live files a batch of ``keys`` (the key's first column) would rewrite
    without deletion vectors: those whose statistics' range holds one of them (a file
    without statistics might)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if not actions.num_rows:
        return 0
    sizes = actions["size_bytes"].to_numpy(zero_copy_only=False)
    low_name, high_name = f"min.{key}", f"max.{key}"
    if low_name not in actions.column_names or not pa.types.is_integer(keys.type):
        return int(sizes.sum())
    wanted = np.unique(keys.drop_null().to_numpy(zero_copy_only=False).astype(np.int64))
    lows = actions[low_name].to_numpy(zero_copy_only=False)
    highs = actions[high_name].to_numpy(zero_copy_only=False)
    known = ~(np.isnan(lows.astype(float)) | np.isnan(highs.astype(float)))
    at = np.searchsorted(wanted, np.where(known, lows, 0).astype(np.int64), side="left")
    inside = at < len(wanted)
    holds = inside & (wanted[np.minimum(at, len(wanted) - 1)] <= np.where(known, highs, 0))
    touched = holds | ~known
    return int(sizes[touched].sum())
