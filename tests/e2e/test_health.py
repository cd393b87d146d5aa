"""/healthz means "this process can make progress", for longer than any liveness window."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess, pgsub, wait_confirmed, write_config
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.e2e


def test_idle_and_disabled_subscriptions_stay_live_and_a_lost_jvm_restarts_the_process(
    publisher: PgDatabase, spark: Any, tmp_path: Path, daemons: Callable[..., DaemonProcess]
) -> None:
    publisher.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    config = tmp_path / "pgsub.yaml"
    # Keepalives every ~1.5 s; the old probe failed an idle stream after 3 + 1 + 30 s.
    # A JVM from the start (its loss is the test's end): by default no table here needs one.
    port = write_config(
        config, publisher, tmp_path / "warehouse", spark_start="at_start", wal_receiver_timeout="3s"
    )
    daemon = daemons(config, port)
    daemon.wait_ready()
    publisher.execute("INSERT INTO t VALUES (1)")
    wait_confirmed(publisher)
    idle_until = time.monotonic() + 40
    while time.monotonic() < idle_until:
        assert daemon.get("/healthz")[0] == 200, daemon.get("/healthz")[1]
        time.sleep(2)
    assert pgsub("disable", "-c", str(config), "sub1").returncode == 0
    wait_until(lambda: daemon.get("/readyz")[0] == 200 and status(daemon) == "disabled", 30)
    disabled_until = time.monotonic() + 40
    while time.monotonic() < disabled_until:
        assert daemon.get("/healthz")[0] == 200, daemon.get("/healthz")[1]
        time.sleep(2)

    jvm = subprocess.run(
        ["pgrep", "-P", str(daemon.process.pid), "java"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert jvm, "no Spark JVM under the daemon"
    subprocess.run(["kill", "-9", *jvm], check=True)
    assert daemon.wait_exit(timeout=120) == 1, daemon.logs()
    assert "the Spark JVM is gone" in daemon.logs()


def status(daemon: DaemonProcess) -> str:
    return str(daemon.get("/status")[1]["subscriptions"][0]["state"])
