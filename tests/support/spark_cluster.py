"""A Spark standalone cluster on 127.0.0.1, started from the pyspark package's own launcher.

One Master and ``workers`` Worker JVMs (``spark-class ...deploy.master.Master``
and ``...deploy.worker.Worker``), each in its own process group so that
stopping a Worker also ends the executors it launched. Ports are free ones,
the Master's REST server is off, and every log and work folder is under
``root``. Nothing survives ``stop()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark

from tests.support.pgcluster import free_port, wait_until

SPARK_HOME = Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.root = root
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._workers = workers
        self._cores = cores
        self._memory = memory
        self._processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # Executors' Python workers run the interpreter the tests run.
            "PYSPARK_PYTHON": sys.executable,
        }

    def _launch(self, name: str, *args: str) -> Path:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        self._processes.append(process)
        self._logs.append(log)
        return log

    def _wait_for(self, log: Path, line: str) -> None:
        def seen() -> bool:
            for process in self._processes:
                if process.poll() is not None:
                    raise AssertionError(f"a Spark process exited:\n{self.logs()}")
            return line in log.read_text(errors="replace")

        wait_until(seen, timeout=120, interval=0.5, what=f"{log.name}: {line!r}")

    def start(self) -> StandaloneCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            master = self._launch(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--webui-port", str(free_port()),
            )  # fmt: skip
            self._wait_for(master, "I have been elected leader")
            for n in range(self._workers):
                worker = self._launch(
                    f"worker{n}",
                    "org.apache.spark.deploy.worker.Worker", self.url,
                    "--host", "127.0.0.1", "--cores", str(self._cores),
                    "--memory", self._memory, "--webui-port", str(free_port()),
                    "--work-dir", str(self.root / f"work{n}"),
                )  # fmt: skip
                self._wait_for(worker, "Successfully registered with master")
        except BaseException:
            self.stop()
            raise
        return self

    def logs(self, tail: int = 3000) -> str:
        """Each process's log (its last ``tail`` characters; 0: all of it)."""
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}"
            for log in self._logs
            if log.exists()
        )

    def stop(self) -> None:
        for process in reversed(self._processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self._processes):
            end_group(process)
        self._processes.clear()


def end_group(process: subprocess.Popen[bytes], grace: float = 30) -> None:
    """Wait for ``process`` (a group leader sent SIGTERM) to end; SIGKILL its group after
    ``grace`` seconds."""
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def standalone_cluster(root: Path, **settings: object) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(root, **settings)  # type: ignore[arg-type]
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
