"""Other writers of a table pgsub writes (docs/tables.md, "Other writers"): a Spark OPTIMIZE,
DELETE and VACUUM and a delta-rs compaction committing while pgsub applies batches never
make a row disappear or appear twice, and a commit another engine renamed over pgsub's is
caught before its batch is confirmed, then applied again."""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deltalake
import pytest

from apply.core.errors import TargetTableError
from apply.core.features import FeatureMode, TableFeatures
from apply.core.records import BatchResult
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from apply.delta.writer import checkpoint, delta_rs_merge, overwrite
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import Lsn
from tests.support.delta_log import writers
from tests.unit.apply.builders import batch, dele, ins, relation, tx, upd

pytestmark = pytest.mark.integration

T = relation("id", "v")
KEYS = 200  # what the publisher writes: ids 0..199
FOREIGN = range(1000, 1010)  # rows only the other writer's DELETE touches


def _rows_by_spark(spark: Any, folder: Path) -> list[tuple[int, str]]:
    rows = spark.read.format("delta").load(str(folder)).collect()
    return sorted((int(r["id"]), str(r["v"])) for r in rows)


def _rows_by_delta_rs(folder: Path) -> list[tuple[int, str]]:
    table = deltalake.DeltaTable(str(folder))
    found = deltalake.QueryBuilder().register("t", table).execute("SELECT id, v FROM t")
    import pyarrow as pa

    rows = pa.table(found.read_all()).to_pylist()
    return sorted((int(r["id"]), str(r["v"])) for r in rows)


def _conflicted(exc: Exception) -> bool:
    """Whether ``exc`` is Delta refusing a commit that conflicts with one made meanwhile."""
    text = str(exc)
    return (
        isinstance(exc, deltalake.exceptions.CommitFailedError)
        or "DELTA_CONCURRENT" in text
        or "ConcurrentModification" in text
    )


def _options(way: str) -> TableOptions:
    vectors = FeatureMode.ALWAYS if way == "vectors" else FeatureMode.NEVER
    return TableOptions(features=TableFeatures(deletion_vectors=vectors))


@pytest.fixture(params=["rewrite", "merge", "vectors"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which of pgsub's ways writes the table: its own whole-table rewrite, delta-rs's MERGE,
    or its own deletion vectors."""
    if request.param == "merge":
        monkeypatch.setattr(delta_rs_merge, "REWRITE_MAX_BYTES", -1)
    return str(request.param)


def test_other_writers_beside_pgsub_never_lose_or_double_a_row(
    spark: Any, warehouse: Path, way: str
) -> None:
    tables = DeltaTables(spark, str(warehouse), "sub1", _options(way))
    folder = warehouse / "public" / "t"
    model: dict[int, str] = {}
    rng = random.Random(7)
    end = 100

    def apply(*changes: Any) -> None:
        """A batch as the apply worker runs it: written, read back, then confirmed; a batch
        that fails (another writer's commit in its way) applied again, as a retry does."""
        nonlocal end
        end += 100
        for _ in range(5):
            applier = BatchApplier("sub1", tables, lambda oid: None)
            try:
                result = applier.apply(batch(tx(*changes, end=end)))
                applier.verify(result)
                return
            except (TargetTableError, Exception) as exc:
                last = exc
            finally:
                applier.close()
        raise AssertionError(f"the batch at {end} failed five times: {last}")

    apply(*(ins(T, i, "copy") for i in [*range(KEYS), *FOREIGN]))
    model.update({i: "copy" for i in range(KEYS)})
    done, deleted = threading.Event(), threading.Event()
    failures: list[BaseException] = []
    refused: list[str] = []  # the other writer's commits Delta refused

    def other_writer() -> None:
        """A user's jobs on the same table, from another engine, while pgsub writes."""
        path = f"delta.`{folder}`"

        def compact() -> None:
            deltalake.DeltaTable(str(folder)).optimize.compact()

        def delete() -> None:
            spark.sql(f"DELETE FROM {path} WHERE id >= 1000").collect()
            deleted.set()  # committed: those rows are gone for good

        jobs: list[Callable[[], object]] = [
            lambda: spark.sql(f"OPTIMIZE {path}").collect(),
            delete,
            lambda: spark.sql(f"VACUUM {path}").collect(),
        ]
        if way != "vectors":  # delta-rs does not write a table with deletion vectors
            jobs.append(compact)
        try:
            while not done.is_set():
                for job in jobs:
                    try:
                        job()
                    except Exception as exc:
                        # Delta's conflict checks refusing the other job's commit (pgsub's
                        # came first): that job failed, as it would for its user; nothing
                        # of pgsub's is lost.
                        if not _conflicted(exc):
                            raise
                        refused.append(type(exc).__name__)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=other_writer)
    thread.start()
    try:
        for step in range(25):
            changes = []
            for key in rng.sample(range(KEYS), 8):
                if key in model and rng.random() < 0.2:
                    changes.append(dele(T, key, None))
                    del model[key]
                elif key in model:
                    changes.append(upd(T, key, f"s{step}"))
                    model[key] = f"s{step}"
                else:
                    changes.append(ins(T, key, f"s{step}"))
                    model[key] = f"s{step}"
            apply(*changes)
    finally:
        done.set()
        thread.join()
    assert not failures, failures
    if not deleted.is_set():  # every DELETE lost to pgsub's commits: the rows stay
        model.update(dict.fromkeys(FOREIGN, "copy"))
    want = sorted(model.items())
    assert _rows_by_spark(spark, folder) == want
    assert _rows_by_delta_rs(folder) == want
    assert tables.applied_lsn("public.t") == Lsn(end)
    assert {"pgsub", "delta-rs"} & set(writers(folder))  # pgsub's own ways wrote it


def _commit_over(folder: Path, version: int) -> None:
    """What Spark's LogStore on a local folder does when it found ``version`` free before
    pgsub took it: its own commit renamed over pgsub's (a property set, here)."""
    log = folder / "_delta_log"
    metadata = next(
        json.loads(line)
        for line in (log / f"{0:020d}.json").read_text().splitlines()
        if "metaData" in line
    )
    metadata["metaData"]["configuration"]["user.note"] = "set by another engine"
    info = {"commitInfo": {"operation": "SET TBLPROPERTIES", "engineInfo": "Apache-Spark"}}
    temporary = log / f".{version:020d}.json.spark.tmp"
    temporary.write_text(json.dumps(info) + "\n" + json.dumps(metadata) + "\n")
    os.replace(temporary, log / f"{version:020d}.json")


@pytest.mark.parametrize("checkpointed", [False, True], ids=["", "checkpointed"])
@pytest.mark.parametrize("way", ["rewrite", "merge", "vectors"])
def test_a_commit_renamed_over_is_caught_before_it_is_confirmed_then_applied_again(
    spark: Any, warehouse: Path, way: str, checkpointed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``checkpointed``: pgsub checkpoints every version, so one at the version renamed over
    (a table's checkpoint falls there once in its interval): made anew from the log as it
    is, or every reader starting from it would miss the other engine's commit. Otherwise
    none: where a table's checkpoint falls depends on its folder's name, here pytest's."""
    if way == "merge":
        monkeypatch.setattr(delta_rs_merge, "REWRITE_MAX_BYTES", -1)
    monkeypatch.setattr(checkpoint, "checkpoint_due", lambda *args: checkpointed)
    monkeypatch.setattr(overwrite, "checkpoint_due", lambda *args: checkpointed)
    tables = DeltaTables(spark, str(warehouse), "sub1", _options(way))
    folder = warehouse / "public" / "t"
    applier = BatchApplier("sub1", tables, lambda oid: None)
    try:
        applier.apply(batch(tx(*(ins(T, i, "a") for i in range(5)), end=100)))
        result: BatchResult = applier.apply(batch(tx(upd(T, 1, "b"), end=200)))
        (written,) = result.tables
        assert written.write.version is not None
        _commit_over(folder, written.write.version)
        renamed_over = folder / "_delta_log" / f"{written.write.version:020d}.checkpoint.parquet"
        assert renamed_over.exists() == checkpointed
        made = renamed_over.stat().st_mtime_ns if checkpointed else 0
        with pytest.raises(TargetTableError, match="no longer the commit pgsub made"):
            applier.verify(result)
        if checkpointed:  # made again, from the other engine's commit
            assert renamed_over.stat().st_mtime_ns > made
    finally:
        applier.close()
    # The attempt failed before confirming 200: the next one resends it, and it lands.
    assert tables.applied_lsn("public.t") == Lsn(100)
    again = BatchApplier("sub1", tables, lambda oid: None)
    try:
        again.verify(again.apply(batch(tx(upd(T, 1, "b"), end=200))))
    finally:
        again.close()
    assert _rows_by_spark(spark, folder) == [(0, "a"), (1, "b"), (2, "a"), (3, "a"), (4, "a")]
    assert _rows_by_delta_rs(folder) == _rows_by_spark(spark, folder)
    properties = deltalake.DeltaTable(str(folder)).metadata().configuration
    assert properties.get("user.note") == "set by another engine"
