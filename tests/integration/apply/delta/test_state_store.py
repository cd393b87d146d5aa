"""The state store on a local warehouse: delta-rs appends and reads, Spark reads the same log,
and a state table an older pgsub made with Spark is carried on."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from apply.core.records import StoredTableState
from apply.delta.state_store import CheckpointStore, SettingsStore, TableStateStore
from apply.delta.writer.local_tables import ddl_schema
from subscriber.replication.lsn import Lsn

pytestmark = pytest.mark.integration


def writers(path: str) -> list[str]:
    """The engine of each commit of the Delta table at ``path``, oldest first."""
    found = []
    for entry in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None:
                found.append(str(info.get("engineInfo") or info.get("clientVersion")))
    return found


def test_state_changes_go_through_delta_rs_and_spark_reads_them(
    spark: Any, warehouse: Path
) -> None:
    store = TableStateStore(spark, str(warehouse))
    first = store.record("sub1", [StoredTableState(1, "public", "a", "i", None)])
    store.record("sub1", [StoredTableState(1, "public", "a", "d", None)])
    second = store.record("sub1", [StoredTableState(1, "public", "a", "f", Lsn(0x1234))])
    store.record("other", [StoredTableState(1, "public", "a", "r", Lsn(9))])

    (state,) = store.load("sub1").values()
    assert (state.state, state.lsn, state.recorded_at) == ("f", Lsn(0x1234), second)
    assert first < second and state.recorded_at is not None and state.recorded_at.tzinfo
    assert all("delta-rs" in w for w in writers(store.path)), writers(store.path)
    # Spark reads what delta-rs wrote, timestamps included.
    rows = spark.read.format("delta").load(store.path).where("subscription = 'sub1'").collect()
    assert sorted(r["state"] for r in rows) == ["d", "f", "i"]
    assert max(r["recorded_at"] for r in rows).astimezone(UTC) == second

    checkpoints = CheckpointStore(spark, str(warehouse))
    assert checkpoints.origin_lsn("sub1") == Lsn(0)
    checkpoints.record("sub1", Lsn(100), 0, {"public.a": 3})
    checkpoints.record("sub1", Lsn(250), 0, {"public.a": 4, "public.b": 1})
    assert checkpoints.origin_lsn("sub1") == Lsn(250)
    (latest,) = spark.read.format("delta").load(checkpoints.path).where("lsn = 250").collect()
    assert latest["tables"] == {"public.a": 4, "public.b": 1}

    settings = SettingsStore(spark, str(warehouse))
    settings.record("sub1", "skip_lsn", "0/10")
    settings.record("sub1", "skip_lsn", "")
    settings.record("sub1", "enabled", "false")
    assert settings.load("sub1") == {"enabled": "false"}


def test_a_state_table_an_older_pgsub_made_with_spark_is_carried_on(
    spark: Any, warehouse: Path
) -> None:
    store = TableStateStore(spark, str(warehouse))
    old = datetime(2026, 1, 1, tzinfo=UTC)
    spark.createDataFrame(
        [("sub1", 7, "public", "t", "r", 42, old)], schema=store.ddl
    ).write.format("delta").save(store.path)

    assert store.load("sub1")[7].state == "r"
    store.record("sub1", [StoredTableState(7, "public", "t", "i", None)])  # pgsub resync
    assert store.load("sub1")[7].state == "i"
    assert writers(store.path)[0].startswith("Apache-Spark")
    assert "delta-rs" in writers(store.path)[-1]
    assert spark.read.format("delta").load(store.path).count() == 2


def test_state_table_schemas_map_to_arrow() -> None:
    schema = ddl_schema(CheckpointStore.ddl)
    assert str(schema.field("tables").type) == "map<string, int64>"
    assert str(schema.field("recorded_at").type) == "timestamp[us, tz=UTC]"


def test_a_process_that_read_the_state_store_exits_with_its_own_code(
    spark: Any, warehouse: Path
) -> None:
    """An admin command's exit code is what it says: reading through delta-rs's pyarrow
    dataset made about every other process abort at exit (134), an error's 2 lost."""
    import subprocess
    import sys

    for _ in range(5):
        TableStateStore(spark, str(warehouse)).record(
            "sub1", [StoredTableState(1, "public", "a", "r", Lsn(1))]
        )
    SettingsStore(spark, str(warehouse)).record("sub1", "enabled", "true")
    script = (
        "import sys\n"
        "from apply.delta.state_store import SettingsStore, TableStateStore\n"
        f"SettingsStore(lambda: None, {str(warehouse)!r}).load('sub1')\n"
        f"TableStateStore(lambda: None, {str(warehouse)!r}).load('sub1')\n"
        "sys.exit(2)\n"
    )
    codes = [
        subprocess.run([sys.executable, "-c", script], check=False, timeout=60).returncode
        for _ in range(12)
    ]
    assert codes == [2] * 12
