"""The daemon as a Spark Connect client: a server started from pyspark's launcher.

``spark.remote: sc://...``: the daemon holds no JVM; every Delta operation
travels as SQL or a DataFrame plan to the server (``apply.delta.spark.sql``), the
commit marks as the server-side session's conf, and (``spark.sees_warehouse:
false``) the initial copy's CTID ranges are read by Spark tasks in the
server. The same scenarios as on a standalone cluster (``tests.support.scale_out``), read back by
delta-rs and Spark against the publisher; then the default, ``auto``: the
server lists the daemon's file, and the daemon copies and merges the small
tables itself. Marked ``cluster``: ``pytest -m
"not cluster"`` leaves them out of a quick local run; ``make test`` runs
them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import deltalake
import pytest

from tests.support.daemon import DaemonProcess, group_commands, wait_confirmed, write_config
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.scale_out import (
    copy_stream_conflicts_and_status,
    kills_during_the_copy_and_a_batch_then_restart,
    tables_ready,
)
from tests.support.spark_connect import ConnectServer, connect_server

# A server JVM beside the daemon, on two cores shared with the other test process.
pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    with connect_server(tmp_path_factory.mktemp("spark-connect")) as started:
        yield started


def test_copy_stream_conflicts_and_status_through_spark_connect(
    server: ConnectServer,
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    def thin_client(daemon: DaemonProcess) -> None:
        assert "java" not in group_commands(daemon.process.pid)

    copy_stream_conflicts_and_status(
        {"remote": server.url, "sees_warehouse": False},
        publisher,
        spark,
        tmp_path,
        daemons,
        thin_client,
    )
    # The MERGEs were Spark's: the server's engine, not delta-rs, made those commits.
    history = deltalake.DeltaTable(str(tmp_path / "warehouse" / "public" / "keyed")).history()
    merges = [c for c in history if c.get("operation") == "MERGE"]
    assert merges and all("Apache-Spark" in str(c.get("engineInfo")) for c in merges), history


def test_kills_during_the_copy_and_a_batch_through_spark_connect_then_restart(
    server: ConnectServer,
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """The server outlives each killed client (its sessions expire) and keeps the ranges its
    tasks staged; the last restart opens new sessions and loses and repeats nothing."""
    kills_during_the_copy_and_a_batch_then_restart(
        {"remote": server.url, "sees_warehouse": False}, publisher, spark, tmp_path, daemons
    )


def test_a_server_that_sees_the_warehouse_folder_leaves_small_tables_to_pgsub(
    server: ConnectServer,
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """``spark.sees_warehouse: auto`` (the default): the server reads back the daemon's token
    file, so the daemon reads and writes the copies and merges the small keyed tables'
    batches itself, as with a local Spark."""
    daemon = copy_stream_conflicts_and_status(
        {"remote": server.url}, publisher, spark, tmp_path, daemons
    )
    seen = [e for e in daemon.events() if e["event"].startswith("spark sees the warehouse")]
    assert len(seen) == 1, daemon.logs()
    assert not list((tmp_path / "warehouse" / "_pgsub").glob("seen-by-spark/*"))

    def engines(table: str) -> list[str]:  # oldest commit first
        path = str(tmp_path / "warehouse" / "public" / table)
        history = sorted(deltalake.DeltaTable(path).history(), key=lambda c: c["version"])
        return [str(c.get("engineInfo")) for c in history]

    # Up to the test's own delete (delta-rs, another writer): the copy and the batches are
    # pgsub's; the batch of the delete_missing conflict after it is Spark's, as it is with a
    # local Spark.
    keyed = engines("keyed")
    other = max(i for i, engine in enumerate(keyed) if engine.startswith("delta-rs"))
    assert "pgsub" in keyed[:other], keyed
    assert not any("Apache-Spark" in engine for engine in keyed[:other]), keyed
    # A table without a key has its copy by pgsub, its batches by Spark (a multiset's).
    assert "Apache-Spark" not in engines("bag")[0], engines("bag")


def test_origin_differs_through_spark_connect(
    server: ConnectServer,
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    """track_origin: row tracking and the table's history, read through the server, tell
    the rows another writer changed last (update_origin_differs, delete_origin_differs).
    The copy, read by the daemon (the server sees the warehouse folder), is landed by
    Spark (delta-rs writes no row tracking) from files staged in that folder."""
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t;"
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 4) g"
    )
    warehouse = tmp_path / "warehouse"
    config = tmp_path / "pgsub.yaml"
    port = write_config(
        config, publisher, warehouse, remote=server.url, track_origin=True, copy_data=True
    )
    daemon = daemons(config, port)
    daemon.wait_ready(timeout=300)
    wait_until(lambda: tables_ready(daemon, 1), timeout=300, what="the table READY")
    path = warehouse / "public" / "t"
    spark.sql(f"UPDATE delta.`{path}` SET v = 'local' WHERE id IN (1, 2)")  # another writer
    publisher.execute("UPDATE t SET v = 'remote' WHERE id = 1; DELETE FROM t WHERE id = 2")
    publisher.execute("UPDATE t SET v = 'plain' WHERE id = 3")
    wait_confirmed(publisher)
    metrics = daemon.get("/metrics")[1]
    for kind in ("update_origin_differs", "delete_origin_differs"):
        assert (
            f'pgsub_conflicts_total{{relation="public.t",subscription="sub1",type="{kind}"}} 1.0'
            in metrics
        ), kind
    assert daemon.terminate() == 0, daemon.logs()
    (copied,) = [e for e in daemon.events() if e["event"] == "table copy started"]
    assert copied["read_by"] == "pgsub"
    assert not list((warehouse / "_pgsub" / "copy-staging").rglob("*.parquet"))
    detected = [e for e in daemon.events() if e.get("conflict")]
    assert sorted(e["conflict"] for e in detected) == [
        "delete_origin_differs",
        "update_origin_differs",
    ]
    with publisher.connect() as conn:
        assert_delta_equals_publisher(conn, "public.t", spark, str(path), ("id",))
