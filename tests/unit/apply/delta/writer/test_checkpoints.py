"""Checkpoints at versions of each table's own (``apply.delta.writer.overwrite.checkpoint_due``),
made by pgsub from the commits since the last (``apply.delta.writer.checkpoint``), and the
log's expired files removed."""

import json
import os
import time
import tracemalloc
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

from apply.delta.files.local_store import LocalStore
from apply.delta.writer.checkpoint import _kept_rows, _retention_ms, clean_log
from apply.delta.writer.checkpoint_actions import SCHEMA, LogSince, bodies, file_key
from apply.delta.writer.overwrite import checkpoint_due


def test_tables_written_by_the_same_batches_do_not_checkpoint_together() -> None:
    """200 tables, one commit each per batch: before, all 200 checkpointed in one batch
    every 100 (a 6 s stall); now each once per interval, a few per batch."""
    folders = [f"/warehouse/ours/t{n}" for n in range(200)]
    due = Counter(
        version
        for folder in folders
        for version in range(1, 101)
        if checkpoint_due(version, {}, folder)
    )
    assert sum(due.values()) == 200  # each table once in 100 versions
    assert max(due.values()) <= 10
    interval = {"delta.checkpointInterval": "10"}
    assert sum(checkpoint_due(v, interval, folders[0]) for v in range(1, 101)) == 10
    assert checkpoint_due(7, interval, "/w/t/") == checkpoint_due(7, interval, "/w/t")


def _add(path: str, vector: dict[str, object] | None = None) -> dict[str, object]:
    add: dict[str, object] = {"path": path, "size": 1, "modificationTime": 0, "dataChange": True}
    return {"add": {**add, "deletionVector": vector} if vector else add}


def _remove(path: str, when: int, vector: dict[str, object] | None = None) -> dict[str, object]:
    remove: dict[str, object] = {"path": path, "deletionTimestamp": when, "dataChange": True}
    return {"remove": {**remove, "deletionVector": vector} if vector else remove}


VECTOR = {
    "storageType": "u",
    "pathOrInlineDv": "ab",
    "offset": 1,
    "sizeInBytes": 4,
    "cardinality": 2,
}


def _base() -> pa.Table:
    """A checkpoint of files a (with a vector) and b live, c a tombstone, one txn."""
    rows = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": "x",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": "{}",
                "partitionColumns": [],
                "configuration": {},
            }
        },
        {"txn": {"appId": "pgsub/sub1", "version": 5}},
        {"add": {**_add("a", VECTOR)["add"], "partitionValues": {}}},  # type: ignore[dict-item]
        {"add": {**_add("b")["add"], "partitionValues": {}}},  # type: ignore[dict-item]
        _remove("c", 1_000),
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_a_checkpoint_keeps_what_the_commits_since_did_not_replace() -> None:
    """The base's live files less those removed since (by path and vector), its tombstones
    less the expired and those added again, its txn less the replaced; the actions since
    are the rest."""
    since = LogSince(10)
    since.take(11, [{"commitInfo": {}}, _remove("a", 5_000, VECTOR), _add("a"), _add("d")])
    since.take(12, [{"txn": {"appId": "pgsub/sub1", "version": 6}}, _add("c"), _remove("d", 6_000)])
    assert since.followed and since.gone == {file_key("a", VECTOR)}
    kept = _kept_rows(_base(), since, cutoff=2_000)
    assert kept is not None
    rows = kept.to_pylist()
    assert [r["add"]["path"] for r in rows if r["add"]] == ["b"]  # a replaced, c re-added
    assert not [r for r in rows if r["remove"]]  # c's tombstone: re-added, and expired anyway
    assert not [r for r in rows if r["txn"]]  # replaced by version 6
    assert len([r for r in rows if r["protocol"] or r["metaData"]]) == 2
    assert set(since.adds) == {file_key("a", None), file_key("c", None)}
    assert set(since.removes) == {file_key("a", VECTOR), file_key("d", None)}


def test_the_commits_since_hold_a_files_actions_as_text() -> None:
    """An open table keeps its removes until its next checkpoint, up to 100 commits: 100
    tables' worth, a rewritten file a commit as pgsub's overwrite removes it, each read
    from its commit's line, held in under 6 MB (4 MB; as the dicts read, 10 MB), and the
    checkpoint's rows are the actions as taken."""
    removes = [
        {
            "remove": {
                "path": f"part-00000-{uuid.uuid4()}-c000.snappy.parquet",
                "deletionTimestamp": 1_700_000_000_000 + n,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": {},
                "size": 120_000 + n,
            }
        }
        for n in range(10_000)
    ]
    lines = [json.dumps(remove) for remove in removes]
    tracemalloc.start()
    try:
        since = LogSince(0)
        for version, line in enumerate(lines, start=1):
            since.take(version, [json.loads(line)])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 6 * 2**20
    assert since.followed and len(since.removes) == 10_000
    assert bodies(since.removes) == [remove["remove"] for remove in removes]


def test_a_remove_of_a_file_the_base_does_not_hold_live_is_not_followed() -> None:
    """A file removed since that the base checkpoint does not list live - spelled another
    way, or a log this does not follow - leaves the checkpoint to delta-rs."""
    since = LogSince(10)
    since.take(11, [_remove("a", 5_000)])  # live in the base with a vector, not without
    assert _kept_rows(_base(), since, cutoff=0) is None


def test_an_action_or_field_without_a_place_in_the_checkpoint_is_not_followed() -> None:
    cases: list[list[dict[str, Any]]] = [
        [{"add": {"path": "x", "size": 1, "modificationTime": 0, "dataChange": True, "new": 1}}],
        [{"checkpointMetadata": {"version": 3}}],
        [
            {
                "add": {
                    "path": "x",
                    "partitionValues": {"p": "1"},
                    "size": 1,
                    "modificationTime": 0,
                    "dataChange": True,
                }
            }
        ],
        [{"txn": {}, "add": {}}],  # two actions in one line
    ]
    for actions in cases:
        since = LogSince(0)
        since.take(1, actions)
        assert not since.followed, actions
    since = LogSince(0)
    since.take(2, [_add("x")])  # a commit skipped
    assert not since.followed


def test_the_expired_log_goes_up_to_the_newest_checkpoint_as_old(tmp_path: Path) -> None:
    """Commits and checkpoints older than the log's retention go, up to the newest
    checkpoint itself that old, whose commit stays; younger files and later versions
    stay whatever they are."""
    log = tmp_path / "_delta_log"
    log.mkdir()
    old = time.time() - 3 * 3600
    for version in range(12):
        (log / f"{version:020d}.json").write_text("{}\n")
    for version in (4, 8, 11):
        (log / f"{version:020d}.checkpoint.parquet").write_bytes(b"x")
    (log / "_last_checkpoint").write_text("{}")
    for path in log.iterdir():
        if path.name[:20].isdigit() and int(path.name[:20]) <= 9:
            os.utime(path, (old, old))
    hours = {"delta.logRetentionDuration": "interval 2 hours"}
    clean_log(LocalStore(str(tmp_path)), 11, hours)
    left = sorted(path.name for path in log.iterdir())
    assert left == sorted(
        [f"{v:020d}.json" for v in range(8, 12)]
        + [f"{8:020d}.checkpoint.parquet", f"{11:020d}.checkpoint.parquet", "_last_checkpoint"]
    )
    clean_log(LocalStore(str(tmp_path)), 11, {})  # 30 days: nothing that old
    assert sorted(path.name for path in log.iterdir()) == left


def test_retentions_read_as_delta_spells_them() -> None:
    tombstones = ("delta.deletedFileRetentionDuration", 7)
    assert _retention_ms({}, tombstones) == 7
    assert _retention_ms({tombstones[0]: "interval 168 hours"}, tombstones) == 168 * 3_600_000
    assert _retention_ms({tombstones[0]: "interval 1 week"}, tombstones) == 604_800_000
    assert _retention_ms({tombstones[0]: "INTERVAL 2 DAYS"}, tombstones) == 2 * 86_400_000
    assert _retention_ms({tombstones[0]: "forever"}, tombstones) > 10**15  # keeps everything
