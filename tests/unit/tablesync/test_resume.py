"""The staged copy's pieces: its manifest, its spool folders, and the key filter."""

from __future__ import annotations

import json
from collections.abc import Generator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from apply.arrival.spool_layout import SpoolLayout
from apply.columns.schema import TargetColumn, TargetSchema
from apply.columns.typemap import ColumnType
from subscriber.replication.lsn import Lsn
from tablesync.copy import BlockRange
from tablesync.resume import (
    Manifest,
    RangeStage,
    changed_since,
    empty_keys,
    forget_staged,
    key_schema,
    layout,
    next_attempt,
    within_any,
    without_keys,
)

INT4, TEXT, NUMERIC, TIMESTAMPTZ = 23, 25, 1700, 1184


def schema(*key: str) -> TargetSchema:
    columns = (
        TargetColumn("id", ColumnType(INT4, -1)),
        TargetColumn("name", ColumnType(TEXT, -1)),
        TargetColumn("amount", ColumnType(NUMERIC, (12 << 16 | 2) + 4)),
        TargetColumn("at", ColumnType(TIMESTAMPTZ, -1)),
    )
    return TargetSchema("public.t", columns, key)


def manifest(**changes: object) -> Manifest:
    fields: dict[str, object] = {
        "slot": "pgsub_sub1_sync_16384_7",
        "lsn": Lsn.parse("0/1A2B3C4"),
        "xmin": 4_000_000_000,
        "relation": "16384:16390",
        "layout": layout(schema("id")),
        "ranges": (BlockRange(0, 10), BlockRange(10, 20), BlockRange(20, None)),
    }
    return Manifest(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_manifest_survives_its_file() -> None:
    original = next_attempt(manifest())
    assert Manifest.from_json(original.to_json()) == original
    assert original.attempt == 2 and original.resumed and not manifest().resumed
    read = next_attempt(manifest(read_at=Lsn.parse("0/2B3C4D5")))
    assert Manifest.from_json(read.to_json()).read_at == Lsn.parse("0/2B3C4D5")


def test_a_manifest_written_before_read_at_is_read() -> None:
    """A spool staged by the release before: no ``read_at`` (the catch-up goes to the
    leader's position, as it did)."""
    text = json.loads(manifest().to_json())
    del text["read_at"]
    assert Manifest.from_json(json.dumps(text)) == manifest()


def test_the_layout_names_the_columns_their_types_and_the_key() -> None:
    assert layout(schema("id")) != layout(schema("id", "name"))
    assert "`amount` decimal(12,2)" in layout(schema("id"))


def test_changed_since_compares_xids_modulo_two_to_the_32() -> None:
    text = changed_since(4_000_000_000 + (1 << 32)).as_string(None)
    assert "4000000000" in text and "4294967296" in text and "2147483648" in text


def test_within_any_is_the_union_of_the_ranges() -> None:
    text = within_any([BlockRange(0, 10), BlockRange(20, None)]).as_string(None)
    assert text == "(ctid < '(10,0)'::tid) OR (ctid >= '(20,0)'::tid)"
    assert within_any([]).as_string(None) == "false"
    assert within_any([BlockRange(0, None)]).as_string(None) == "(true)"


def rows(ids: list[int], names: list[str] | None = None) -> pa.Table:
    names = names or [f"n{i}" for i in ids]
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "name": pa.array(names, pa.string()),
            "amount": pa.array([Decimal(i) / 100 for i in ids], pa.decimal128(12, 2)),
            "at": pa.array(
                [datetime(2026, 1, 1, tzinfo=UTC)] * len(ids), pa.timestamp("us", tz="UTC")
            ),
        }
    )


def test_without_keys_drops_the_rows_whose_key_was_read_again() -> None:
    keys = key_schema(schema("id"))
    assert [c.name for c in keys.columns] == ["id"]
    again = pa.table({"id": pa.array([2, 4, 99], pa.int32())})
    kept = without_keys(rows([1, 2, 3, 4, 5]), again, ("id",))
    assert kept.column_names == ["id", "name", "amount", "at"]
    assert sorted(kept.column("id").to_pylist()) == [1, 3, 5]
    assert without_keys(rows([1]), empty_keys(schema("id")), ("id",)).num_rows == 1


@pytest.mark.parametrize("key", [("id", "name"), ("amount",), ("at", "id")])
def test_without_keys_takes_a_key_of_several_columns_and_of_any_type(
    key: tuple[str, ...],
) -> None:
    block = rows([1, 2, 3], ["a", "b", "c"])
    again = block.slice(1, 1).select(list(key))
    kept = without_keys(block, again, key)
    assert sorted(kept.column("id").to_pylist()) == [1, 3]
    typed = empty_keys(schema(*key))
    assert typed.schema == block.select(list(key)).schema


def test_a_stage_marks_a_folder_complete_only_once_its_blocks_end(tmp_path: Path) -> None:
    stage = RangeStage(SpoolLayout(tmp_path).ranges_of(16384))
    assert stage.manifest() is None and stage.done() == {}
    stage.begin(manifest())
    assert stage.manifest() == manifest()
    passed = list(stage.stage("range-00000", [rows([1, 2]), rows([3])], attempt=1))
    assert [b.num_rows for b in passed] == [2, 1]
    cut = cast(
        "Generator[pa.Table, None, None]",
        stage.stage("range-00001", [rows([4]), rows([5])], attempt=1),
    )
    next(cut)
    cut.close()  # a crash or a stop half-way: no marker
    assert stage.done() == {"range-00000": 1}
    assert stage.rows("range-00000") == 3
    assert [r["id"] for b in stage.read("range-00000") for r in b.to_pylist()] == [1, 2, 3]
    list(stage.stage("range-00001", [rows([6])], attempt=2))  # read again from scratch
    assert stage.done() == {"range-00000": 1, "range-00001": 2}
    assert stage.rows("range-00001") == 1


def test_landed_rows_are_dropped_and_the_manifest_kept(tmp_path: Path) -> None:
    stage = RangeStage(tmp_path / "16384")
    stage.begin(manifest())
    list(stage.stage("range-00000", [rows([1])], attempt=1))
    stage.drop_rows()
    assert stage.done() == {} and stage.manifest() == manifest()
    (stage.root / "manifest.json").write_text('{"slot": "cut sh')  # a torn manifest
    assert stage.manifest() is None
    stage.begin(manifest(attempt=3))
    assert stage.manifest() == manifest(attempt=3)
    stage.clear()
    assert not stage.root.exists()


def test_staged_copies_of_tables_no_longer_copied_are_removed(tmp_path: Path) -> None:
    for relid in (16384, 16390, 16400):
        RangeStage(SpoolLayout(tmp_path).ranges_of(relid)).begin(manifest())
    (SpoolLayout(tmp_path).copy_ranges / "stray").mkdir()
    forget_staged(tmp_path, copying={16390})
    assert [p.name for p in SpoolLayout(tmp_path).copy_ranges.iterdir()] == ["16390"]
    forget_staged(tmp_path / "nothing-there", copying=set())
