"""A table's first commit held back for its copy (apply/delta/writer/local_tables.py's
``create_table(..., hold=True)``, apply/delta/writer/overwrite.py's ``append(...,
creating=...)``): one commit, version 0, makes the table with its rows - the same table
a creation then a copy make, durable before it is named, and only once."""

from __future__ import annotations

import json
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from apply.core.errors import CommitRacedError
from apply.core.records import CommitMark
from apply.delta.files.local_store import LocalStore
from apply.delta.writer.creation import HeldCreation, create_table
from apply.delta.writer.local_tables import is_table
from apply.delta.writer.overwrite import append
from subscriber.replication.lsn import Lsn
from tests.support.fsyncs import recorded_fsyncs

MARK = CommitMark("sub1", Lsn(0x1C00AD0), 0)
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
ROWS = pa.table({"id": pa.array(range(10), pa.int64()), "v": [f"v{n}" for n in range(10)]})
PROPERTIES = {"pgsub.source": "public.t", "pgsub.key": '["id"]'}


def _held(path: Path) -> HeldCreation:
    made = create_table(str(path), SCHEMA, PROPERTIES, hold=True)
    assert made.held is not None and made.table is None and not made.durable
    return made.held


def _made_with_rows(path: Path, rows: pa.Table = ROWS) -> deltalake.DeltaTable:
    held = _held(path)
    columns = held.arrow()
    appended = append(
        LocalStore(str(path)),
        -1,
        rows.cast(columns).to_batches(),
        columns,
        MARK,
        creating=held.actions(),
    )
    assert appended.rows == rows.num_rows
    return deltalake.DeltaTable(str(path))


def test_a_held_creation_commits_nothing_until_its_rows_make_the_table(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _held(path)
    assert not is_table(str(path))  # a log folder without a commit: no table yet
    table = _made_with_rows(path)
    assert table.version() == 0
    assert table.to_pyarrow_table().sort_by("id").equals(ROWS)
    assert table.transaction_version(MARK.txn[0]) == MARK.txn[1]  # the copy's mark
    history = table.history()
    assert [commit["operation"] for commit in history] == ["CREATE TABLE AS SELECT"]
    assert history[0]["userMetadata"] == MARK.user_metadata()


def test_the_table_it_makes_is_the_one_a_creation_then_a_copy_make(tmp_path: Path) -> None:
    """Protocol, columns and properties as ``create_table`` without ``hold`` commits them."""
    together = _made_with_rows(tmp_path / "together")
    create_table(str(tmp_path / "apart"), SCHEMA, PROPERTIES)
    apart = deltalake.DeltaTable(str(tmp_path / "apart"))
    assert together.protocol() == apart.protocol()
    assert together.schema().to_json() == apart.schema().to_json()
    assert together.metadata().configuration == apart.metadata().configuration == PROPERTIES
    assert together.metadata().partition_columns == []


def test_its_files_are_durable_before_the_commit_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t"
    synced = recorded_fsyncs(monkeypatch)
    _made_with_rows(path)
    data = [p for p in synced if p.endswith(".parquet")]
    commit = [p for p in synced if "/_delta_log/.00000000000000000000.json." in p]
    assert len(data) == 1 and len(commit) == 1
    assert synced.index(data[0]) < synced.index(commit[0])
    assert (path / "_delta_log" / "00000000000000000000.json").exists()


def test_a_table_made_meanwhile_by_another_wins_and_the_copy_leaves_no_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t"
    held = _held(path)
    deltalake.write_deltalake(str(path), ROWS.slice(0, 3))  # another writer's version 0
    before = sorted(p.name for p in path.glob("*.parquet"))
    with pytest.raises(CommitRacedError):
        append(
            LocalStore(str(path)),
            -1,
            ROWS.to_batches(),
            held.arrow(),
            MARK,
            creating=held.actions(),
        )
    assert sorted(p.name for p in path.glob("*.parquet")) == before
    assert deltalake.DeltaTable(str(path)).to_pyarrow_table().num_rows == 3


def test_an_empty_copy_makes_the_table_with_no_file(tmp_path: Path) -> None:
    table = _made_with_rows(tmp_path / "t", ROWS.slice(0, 0))
    assert table.version() == 0
    assert table.to_pyarrow_table().num_rows == 0
    assert not list((tmp_path / "t").glob("*.parquet"))


def test_appendable_unless_append_only_or_a_column_may_not_hold_null(tmp_path: Path) -> None:
    held = _held(tmp_path / "t")
    assert held.appendable()
    append_only = HeldCreation(
        held.path, held.columns, {**PROPERTIES, "delta.appendOnly": "true"}, held.made_at
    )
    assert not append_only.appendable()
    fields = json.loads(held.columns)
    fields["fields"][0]["nullable"] = False
    not_null = HeldCreation(held.path, json.dumps(fields), PROPERTIES, held.made_at)
    assert not not_null.appendable()
