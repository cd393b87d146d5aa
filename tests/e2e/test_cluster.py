"""The daemon on a Spark standalone cluster: two Worker JVMs started from pyspark's launcher.

``spark.master: spark://...``: the driver is the daemon, the MERGEs and the
copy's writes run on executors in other JVMs, and the warehouse is a path
every executor sees (one machine here). With ``spark.sees_warehouse: false``
(the daemon would otherwise write that shared folder itself, as through
Spark Connect in ``tests/e2e/test_connect.py``): copy in ranges read by Spark tasks,
streaming apply, conflicts and ``pgsub status`` (``tests.support.scale_out``),
read back by delta-rs and Spark against the publisher. The kills (a copy's
ranges staged by executors, a batch between write and checkpoint) run through
Spark Connect (``tests/e2e/test_connect.py``), whose staging is the same
code: on a cluster they cost as much again on two cores. Marked
``cluster``: ``pytest -m "not cluster"`` leaves them out of a quick local
run; ``make test`` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import DaemonProcess
from tests.support.pgdatabase import PgDatabase
from tests.support.scale_out import (
    copy_stream_conflicts_and_status,
)
from tests.support.spark_cluster import StandaloneCluster, standalone_cluster

# A cluster of three JVMs beside the daemon's, on two cores shared with the other test
# process: minutes, not the suite's default 600 s.
pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster


def test_copy_stream_conflicts_and_status_on_a_standalone_cluster(
    spark_cluster: StandaloneCluster,
    publisher: PgDatabase,
    spark: Any,
    tmp_path: Path,
    daemons: Callable[..., DaemonProcess],
) -> None:
    copy_stream_conflicts_and_status(
        {"master": spark_cluster.url, "sees_warehouse": False}, publisher, spark, tmp_path, daemons
    )
    # The work ran on the cluster's executors, not in a local master.
    logs = spark_cluster.logs(tail=0)
    assert "Registering app pgsub" in logs and "Asked to launch executor" in logs
