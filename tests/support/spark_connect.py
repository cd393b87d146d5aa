"""A Spark Connect server on 127.0.0.1, started from the pyspark package's own launcher.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``
(the server jar ships with pyspark) on a local master, with the Delta jars
``make jars`` resolved and Delta's SQL extension and catalog: what a Spark
Connect deployment with delta-spark serves. Its Python tasks (the initial
copy's range readers) run the interpreter the tests run. The server is in
its own process group; nothing survives ``stop()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from apply.delta.spark.session import delta_jars
from tests.support.pgcluster import free_port, wait_until
from tests.support.spark_cluster import SPARK_HOME, end_group

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED = "Spark Connect server started at"


class ConnectServer:
    def __init__(self, root: Path, master: str = "local[2]") -> None:
        self.root = root
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.master = master
        self.log = root / "connect-server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> ConnectServer:
        self.root.mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.session.timeZone": "UTC",
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": "4",
            "spark.local.dir": str(self.root / "scratch"),
        }
        command = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--class", SERVER_CLASS,
            "--master", self.master,
            "--name", "pgsub-tests-connect",
            "--jars", ",".join(str(jar) for jar in delta_jars()),
        ]  # fmt: skip
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        command.append("spark-internal")
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.root / "logs"),
        }
        with self.log.open("wb") as out:
            self._process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.root,
                start_new_session=True,
            )
        try:
            wait_until(self._started, timeout=180, interval=0.5, what="the Spark Connect server")
        except BaseException:
            self.stop()
            raise
        return self

    def _started(self) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            raise AssertionError(f"the Spark Connect server exited:\n{self.logs()}")
        return STARTED in self.log.read_text(errors="replace")

    def logs(self, tail: int = 3000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-tail:] if tail else text

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        end_group(process)


@contextlib.contextmanager
def connect_server(root: Path, **settings: str) -> Iterator[ConnectServer]:
    server = ConnectServer(root, **settings)
    server.start()
    try:
        yield server
    finally:
        server.stop()
