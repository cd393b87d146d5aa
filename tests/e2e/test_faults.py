"""Faults while streaming and copying: the publisher restarts, connections are cut.

After each, the Delta tables equal the publisher's, read by Spark and by
delta-rs, rows written during the fault included: nothing lost, nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from subscriber.runtime.embedded import PgCluster
from tests.support.daemon import DaemonProcess, wait_confirmed, write_config
from tests.support.oracle import assert_delta_equals_publisher
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.tcpproxy import TcpProxy
from tests.support.writer import Writer

pytestmark = pytest.mark.e2e

SCHEMA = """
CREATE TABLE k (id int PRIMARY KEY, v text);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE k, bag;
"""


def small_transaction(conn: psycopg.Connection[Any], n: int) -> None:
    """A row into each table in one transaction."""
    with conn.transaction():
        conn.execute("INSERT INTO k VALUES (%s, 'w')", [n])
        conn.execute("INSERT INTO bag VALUES (%s, 'w')", [n % 7])


def steady_load(publisher: PgDatabase) -> Writer:
    """Small transactions into both tables until stopped; survives the publisher's restart."""
    return Writer(publisher, small_transaction, pause=0.02, reconnect=True)


def assert_equal(publisher: PgDatabase, spark: Any, warehouse: Path) -> None:
    with publisher.connect() as conn:
        assert_delta_equals_publisher(conn, "public.k", spark, str(warehouse / "public/k"), ("id",))
        assert_delta_equals_publisher(conn, "public.bag", spark, str(warehouse / "public/bag"))


def test_publisher_restart_mid_stream(
    pg_cluster: Callable[..., PgCluster],
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    publisher = PgDatabase.create(pg_cluster(), "pub")
    publisher.execute(SCHEMA)
    warehouse, config = tmp_path / "warehouse", tmp_path / "pgsub.yaml"
    port = write_config(config, publisher, warehouse, batch={"max_changes": 300})
    daemon = daemons(config, port)
    daemon.wait_ready()
    writer = steady_load(publisher)
    writer.start()
    try:
        wait_until(lambda: writer.written >= 300, timeout=60, what="writes before the restart")
        publisher.cluster.restart()
        wait_until(lambda: writer.written >= 900, timeout=120, what="writes after the restart")
    finally:
        writer.stop()
    wait_confirmed(publisher, timeout=300)
    assert_equal(publisher, spark, warehouse)
    assert daemon.terminate() == 0


def proxied_config(
    config: Path, publisher: PgDatabase, warehouse: Path, proxy: TcpProxy, **settings: Any
) -> int:
    """A config whose subscription reaches the publisher through ``proxy``; the metrics port."""
    port = write_config(config, publisher, warehouse, **settings)
    proxied = publisher.dsn.replace(f"port={publisher.cluster.port}", f"port={proxy.port}")
    assert proxied != publisher.dsn
    config.write_text(config.read_text().replace(publisher.dsn, proxied))
    return port


def table_states(daemon: DaemonProcess) -> set[str]:
    try:
        status, body = daemon.get("/status")
    except OSError:
        return set()
    subscriptions = body.get("subscriptions") or [{}] if status == 200 else [{}]
    return {t["state"] for t in subscriptions[0].get("tables") or []}


def test_connections_cut_during_the_copy_and_the_catch_up_under_load(
    publisher: PgDatabase, spark: Any, tmp_path: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    """A writer commits all along; every connection (the leader's, the sync workers') is cut
    while a table is being copied - the copy fails and starts over - and again once the
    tables are handed over.

    The proxy hands the publisher's bytes over at 64 kB/s per connection until the cut, so
    the copy of a table's 60,000 rows (about 1 MB of CSV) takes seconds whatever the
    machine's speed: the cut lands in it (a local copy takes milliseconds)."""
    publisher.execute(
        SCHEMA + "INSERT INTO k SELECT g, 'old' FROM generate_series(-60000, -1) g;"
        "INSERT INTO bag SELECT g % 13, 'old' FROM generate_series(1, 60000) g;"
    )
    proxy = TcpProxy(publisher.cluster.port)
    proxy.rate = 64 * 1024
    warehouse, config = tmp_path / "warehouse", tmp_path / "pgsub.yaml"
    port = proxied_config(
        config, publisher, warehouse, proxy, copy_data=True, batch={"max_changes": 500}
    )
    writer = steady_load(publisher)
    writer.start()
    try:
        daemon = daemons(config, port)
        # The copy's connection stays open (its snapshot) until the rows are in Delta.
        wait_until(
            lambda: any(e.get("event") == "table copy started" for e in daemon.events()),
            timeout=180,
            interval=0.1,
            what="a table copy under way",
        )
        proxy.rate = None
        assert proxy.cut() > 0
        wait_until(lambda: table_states(daemon) == {"ready"}, timeout=400, what="both tables READY")
        connections = proxy.accepted
        assert proxy.cut() > 0
        wait_until(lambda: proxy.accepted > connections, timeout=120, what="a reconnect")
        committed = writer.written
        wait_until(lambda: writer.written > committed + 100, timeout=60, what="more writes")
        writer.stop()
        wait_confirmed(publisher, timeout=300)
        assert_equal(publisher, spark, warehouse)
        assert daemon.terminate() == 0
    finally:
        writer.stop()
        proxy.close()
    failed = "logical replication table synchronization worker failed"
    assert any(e.get("event") == failed for e in daemon.events()), "the cut failed no copy"


def test_connection_cut_in_the_middle_of_a_large_transaction(
    publisher: PgDatabase, spark: Any, tmp_path: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    publisher.execute(SCHEMA)
    proxy = TcpProxy(publisher.cluster.port)
    try:
        warehouse, config = tmp_path / "warehouse", tmp_path / "pgsub.yaml"
        port = proxied_config(config, publisher, warehouse, proxy, batch={"max_changes": 5000})
        daemon = daemons(config, port)
        daemon.wait_ready()
        publisher.execute(
            "INSERT INTO k SELECT g, 'big' FROM generate_series(1, 40000) g;"
            "INSERT INTO bag SELECT g % 11, 'big' FROM generate_series(1, 40000) g"
        )
        publisher.execute(
            "BEGIN; UPDATE k SET v = 'changed' WHERE id % 3 = 0;"
            " DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag WHERE a = 3 LIMIT 500); COMMIT"
        )
        connections = proxy.accepted
        wait_until(lambda: proxy.cut() > 0, timeout=30, interval=0.2, what="a connection to cut")
        wait_until(lambda: proxy.accepted > connections, timeout=120, what="a reconnect")
        proxy.cut()  # and once more, while the large transactions are being resent
        publisher.execute("INSERT INTO k VALUES (40001, 'after the cuts')")
        wait_confirmed(publisher, timeout=300)
        assert_equal(publisher, spark, warehouse)
        assert daemon.terminate() == 0
    finally:
        proxy.close()
