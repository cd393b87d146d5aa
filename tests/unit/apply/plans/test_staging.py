"""A large transaction's staged pieces: whether a key has rows in two of them, known from
the keys held in memory while they fit, else left to the staged files."""

from __future__ import annotations

from pathlib import Path

import pytest

import apply.plans.staging
from apply.batching.columns_net import keyed_columns_source
from apply.columns.change_columns import ChangeColumns
from apply.columns.schema import target_schema
from apply.core.transactions import RowChange
from apply.plans.staging import StagedSource
from subscriber.replication.messages import Relation
from tests.unit.apply.builders import dele, ins, relation, upd

KEYED = relation("id", "v")
TWO_KEYS = relation("id", "k2", "v", key=("id", "k2"))


def stage_pieces(tmp_path: Path, *pieces: list[RowChange], rel: Relation = KEYED) -> StagedSource:
    schema = target_schema(rel, lambda oid: None, True)
    stage = StagedSource(tmp_path / "stage", schema)
    for changes in pieces:
        source = keyed_columns_source(ChangeColumns.of(rel, changes), schema)
        assert source is not None
        assert stage.add_source(source)
    return stage


def test_keys_in_one_piece_each_are_unique(tmp_path: Path) -> None:
    stage = stage_pieces(tmp_path, [ins(KEYED, 1, "a"), ins(KEYED, 2, "b")], [upd(KEYED, 3, "c")])
    assert stage.pieces == 2 and stage.keys_unique() is True
    assert len(list(stage.directory.glob("piece-*.parquet"))) == 2


def test_a_key_in_two_pieces_is_found(tmp_path: Path) -> None:
    stage = stage_pieces(tmp_path, [ins(KEYED, 1, "a")], [dele(KEYED, 1, None)])
    assert stage.keys_unique() is False


def test_a_composite_key_is_one_key_of_all_its_columns(tmp_path: Path) -> None:
    same_id = stage_pieces(
        tmp_path, [ins(TWO_KEYS, 1, "a", "x")], [ins(TWO_KEYS, 1, "b", "y")], rel=TWO_KEYS
    )
    assert same_id.keys_unique() is True
    both = stage_pieces(
        tmp_path / "2", [ins(TWO_KEYS, 1, "a", "x")], [upd(TWO_KEYS, 1, "a", "y")], rel=TWO_KEYS
    )
    assert both.keys_unique() is False


def test_keys_past_what_is_held_are_left_to_the_staged_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apply.plans.staging, "KEYS_HELD", 16)
    stage = stage_pieces(tmp_path, [ins(KEYED, i, "a") for i in range(10)], [ins(KEYED, 5, "b")])
    assert stage.keys is None and stage.keys_unique() is None  # the ranges meet


def test_pieces_in_key_order_are_unique_without_their_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges that do not meet (a transaction that wrote in key order) say so by themselves,
    even past what is held; ranges that meet are looked at key by key."""
    monkeypatch.setattr(apply.plans.staging, "KEYS_HELD", 16)
    ordered = stage_pieces(tmp_path, [ins(KEYED, i, "a") for i in range(10)], [ins(KEYED, 10, "b")])
    assert ordered.keys is None and ordered.keys_unique() is True
    monkeypatch.setattr(apply.plans.staging, "KEYS_HELD", 1 << 20)
    meeting = stage_pieces(
        tmp_path / "2", [ins(KEYED, 1, "a"), ins(KEYED, 9, "a")], [ins(KEYED, 5, "b")]
    )
    assert meeting.ranges == [(1, 9), (5, 5)] and meeting.keys_unique() is True
