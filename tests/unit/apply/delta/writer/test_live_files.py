"""pgsub's own replay of a table's log (apply/delta/writer/live_files.py): which files are live,
with which vectors, whichever way the log spells them, and which checkpoints it reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apply.delta.files.local_store import LocalStore
from apply.delta.files.store import canonical
from apply.delta.writer.live_files import LiveFiles, UnreadableLogError, latest_version


def _add(path: str, **more: Any) -> dict[str, Any]:
    return {"add": {"path": path, "size": 10, "modificationTime": 1, "dataChange": True, **more}}


def _remove(path: str, **more: Any) -> dict[str, Any]:
    return {"remove": {"path": path, "dataChange": True, **more}}


def _commit(table: Path, version: int, *actions: dict[str, Any]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(a) + "\n" for a in actions)
    (log / f"{version:020d}.json").write_text(lines)


def _checkpoint(table: Path, name: str, paths: list[str], *, sidecar: bool = False) -> None:
    add = pa.struct([("path", pa.string()), ("size", pa.int64()), ("modificationTime", pa.int64())])
    columns: dict[str, pa.Array] = {
        "add": pa.array([{"path": p, "size": 10, "modificationTime": 1} for p in paths], add)
    }
    if sidecar:
        columns["sidecar"] = pa.array([{"path": "x.parquet"}] * len(paths))
    pq.write_table(pa.table(columns), table / "_delta_log" / name)


def _live(table: Path, version: int) -> list[str]:
    files = LiveFiles(LocalStore(str(table)))
    files.read(version)
    return sorted(f.name for f in files.files)


@pytest.mark.parametrize(
    ("added", "removed"),
    [
        ("a%20b.parquet", "a b.parquet"),
        ("a b.parquet", "a%20b.parquet"),
        ("file:///T/x.parquet", "x.parquet"),
        ("x.parquet", "file:/T/x.parquet"),
        ("/T/x.parquet", "file:///T/x.parquet"),
        ("sub/%7Bx%7D.parquet", "sub/{x}.parquet"),
    ],
)
def test_a_file_removed_under_another_spelling_is_gone(
    tmp_path: Path, added: str, removed: str
) -> None:
    """An ``add`` and a ``remove`` of one file, spelt two ways Delta's log allows (a URI,
    percent-encoded, relative or absolute): the file is no longer live. Compared as raw
    strings, it stayed live, and the vector path could write it again with a vector."""
    table = tmp_path / "t"
    spell = str(table)
    _commit(table, 0, _add(added.replace("/T", spell)), _add("kept.parquet"))
    _commit(table, 1, _remove(removed.replace("/T", spell)))
    assert _live(table, 1) == ["kept.parquet"]


def test_a_vector_is_part_of_a_files_identity(tmp_path: Path) -> None:
    table = tmp_path / "t"
    vector = {
        "storageType": "u",
        "pathOrInlineDv": "0" * 20,
        "offset": 1,
        "sizeInBytes": 4,
        "cardinality": 1,
    }
    _commit(table, 0, _add("a.parquet"))
    _commit(table, 1, _remove("a.parquet"), _add("a.parquet", deletionVector=vector))
    _commit(table, 2, _remove("a%2Eparquet"))  # the pair without its vector: not the live one
    files = LiveFiles(LocalStore(str(table)))
    files.read(2)
    assert [(f.name, f.vector is not None) for f in files.files] == [("a.parquet", True)]


def test_canonical_spellings() -> None:
    root = "/w/t"
    assert canonical("a%20b.parquet", root) == "a b.parquet"
    assert canonical("file:/w/t/a.parquet", root) == "a.parquet"
    assert canonical("/elsewhere/a.parquet", root) == "/elsewhere/a.parquet"
    assert canonical("s3://b/w/t/a%3Db.parquet", "s3://b/w/t") == "a=b.parquet"


def test_the_latest_checkpoint_then_the_commits_after_it(tmp_path: Path) -> None:
    table = tmp_path / "t"
    _commit(table, 0, _add("gone.parquet"))
    _commit(table, 1, _add("a.parquet"))
    _checkpoint(table, f"{1:020d}.checkpoint.parquet", ["a.parquet"])
    (table / "_delta_log" / f"{0:020d}.json").unlink()  # cleaned up: only the checkpoint has it
    _commit(table, 2, _add("b.parquet"))
    assert _live(table, 2) == ["a.parquet", "b.parquet"]


def test_a_multi_part_checkpoint_missing_a_part_falls_back_to_an_older_one(
    tmp_path: Path,
) -> None:
    table = tmp_path / "t"
    _commit(table, 0, _add("a.parquet"))
    _commit(table, 1, _add("b.parquet"))
    _checkpoint(table, f"{0:020d}.checkpoint.parquet", ["a.parquet"])
    _checkpoint(table, f"{1:020d}.checkpoint.0000000001.0000000002.parquet", ["a.parquet"])
    # part 2 of 2 is missing (a writer killed half-way): checkpoint 0 and commit 1 are read
    assert _live(table, 1) == ["a.parquet", "b.parquet"]
    _checkpoint(table, f"{1:020d}.checkpoint.0000000002.0000000002.parquet", ["b.parquet"])
    (table / "_delta_log" / f"{1:020d}.json").unlink()
    assert _live(table, 1) == ["a.parquet", "b.parquet"]  # now whole, and read


@pytest.mark.parametrize(
    "name", [f"{1:020d}.checkpoint.3a0d65cd-4056-49b8-937b-95f9e3ee90e5.parquet"]
)
def test_a_v2_checkpoint_is_refused_by_name(tmp_path: Path, name: str) -> None:
    """A UUID-named checkpoint (V2) raised a bare ValueError; it is refused by name now."""
    table = tmp_path / "t"
    _commit(table, 0, _add("a.parquet"))
    _commit(table, 1, _add("b.parquet"))
    _checkpoint(table, name, ["a.parquet", "b.parquet"])
    with pytest.raises(UnreadableLogError, match="V2 checkpoint"):
        _live(table, 1)


def test_a_classic_named_checkpoint_with_sidecars_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t"
    _commit(table, 0, _add("a.parquet"))
    _checkpoint(table, f"{0:020d}.checkpoint.parquet", ["a.parquet"], sidecar=True)
    _commit(table, 1, _add("b.parquet"))
    (table / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(UnreadableLogError, match="sidecar"):
        _live(table, 1)


def test_a_log_without_a_checkpoint_or_its_first_commits_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t"
    _commit(table, 0, _add("a.parquet"))
    _commit(table, 1, _add("b.parquet"))
    (table / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(UnreadableLogError, match="no checkpoint"):
        _live(table, 1)


@pytest.mark.parametrize("commits", [1, 2, 5, 37])
def test_the_latest_version_is_found_without_listing_the_log(tmp_path: Path, commits: int) -> None:
    table = tmp_path / "t"
    for version in range(commits):
        _commit(table, version, _add(f"{version}.parquet"))
    assert latest_version(LocalStore(str(table))) == commits - 1
    (table / "_delta_log" / "_last_checkpoint").write_text('{"version": 0, "size": 1}')
    assert latest_version(LocalStore(str(table))) == commits - 1
    assert latest_version(LocalStore(str(tmp_path / "none"))) == -1
