"""``pgsub run`` as a separate process, as operators run it."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.support.pgcluster import free_port, wait_until
from tests.support.pgdatabase import PgDatabase

if TYPE_CHECKING:
    from tests.plugins.s3 import S3Server

# A test's daemon lives for seconds, not months: its JVM compiles with C1 alone, which
# starts and warms up faster on two cores than the tiered default (a production daemon
# keeps the default, whose C2 code is the faster one for hours of MERGEs).
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pgsub(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """One ``pgsub`` command, run to completion.

    A command that deletes (``pgsub drop``) starts a JVM of its own: cold, beside the
    other test process's JVMs on two cores, it took more than 120 s; hence 300 s."""
    return subprocess.run(
        [sys.executable, "-m", "subscriber.runtime.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={"JAVA_TOOL_OPTIONS": SHORT_LIVED_JVM, **(env or os.environ)},
    )


def write_config(
    path: Path,
    publisher: PgDatabase,
    warehouse: Path | str,
    *,
    master: str = "local[2]",
    remote: str | None = None,
    storage: S3Server | None = None,
    maintenance: dict[str, Any] | None = None,
    spark_start: str | None = None,
    sees_warehouse: bool | None = None,
    **subscription: Any,
) -> int:
    """A config for one subscription ``sub1`` of publication ``pub``; returns the metrics port.

    ``remote``: a Spark Connect server's URL, in place of ``master``; ``storage``: the object
    store the warehouse (an ``s3a://`` URL) is in; ``maintenance``: its section;
    ``spark_start``: ``spark.start`` (on_demand when not given); ``sees_warehouse``:
    ``spark.sees_warehouse`` (auto when not given)."""
    return write_subscriptions(
        path,
        warehouse,
        {"sub1": publisher},
        master=master,
        remote=remote,
        storage=storage,
        maintenance=maintenance,
        spark_start=spark_start,
        sees_warehouse=sees_warehouse,
        **subscription,
    )


def write_subscriptions(
    path: Path,
    warehouse: Path | str,
    publishers: dict[str, PgDatabase],
    *,
    master: str = "local[2]",
    remote: str | None = None,
    storage: S3Server | None = None,
    maintenance: dict[str, Any] | None = None,
    spark_start: str | None = None,
    sees_warehouse: bool | None = None,
    **settings: Any,
) -> int:
    """A config with one subscription of publication ``pub`` per (name, publisher), each
    spooling beside ``path``; the port."""
    port = free_port()
    subscriptions = [
        {
            "name": name,
            "connection": publisher.dsn,
            "publications": ["pub"],
            "copy_data": False,
            "status_interval": "1s",
            "wal_retrieve_retry_interval": "1s",
            # Beside the config, in the test's own folder: not the daemon's default under
            # /tmp/pgsub-<uid>/, where each test's (empty) spool would stay behind.
            "spool_dir": str(path.parent / f"spool-{name}"),
            **settings,
        }
        for name, publisher in publishers.items()
    ]
    config: dict[str, Any] = {
        "warehouse": str(warehouse),
        "spark": {"remote": remote} if remote else {"master": master},
        "metrics": {"host": "127.0.0.1", "port": port},
        "log": {"format": "json", "level": "info"},
        "subscriptions": subscriptions,
    }
    if maintenance is not None:
        config["maintenance"] = maintenance
    if spark_start is not None:
        config["spark"]["start"] = spark_start
    if sees_warehouse is not None:
        config["spark"]["sees_warehouse"] = sees_warehouse
    if storage is not None:  # the keys in files, as a Kubernetes Secret mounts them
        secrets = path.parent / "s3-secrets"
        secrets.mkdir(exist_ok=True)
        for name, value in storage.environment().items():
            (secrets / name).write_text(value)
        config["storage"] = {
            **storage.config(),
            "access_key_id_file": str(secrets / "AWS_ACCESS_KEY_ID"),
            "secret_access_key_file": str(secrets / "AWS_SECRET_ACCESS_KEY"),
        }
    path.write_text(yaml.safe_dump(config))
    return port


class DaemonProcess:
    def __init__(
        self, config: Path, port: int, failpoints: str | None = None, temp: Path | None = None
    ) -> None:
        self.port = port
        env = dict(os.environ)
        env.pop("PGSUB_FAILPOINTS", None)
        env["JAVA_TOOL_OPTIONS"] = SHORT_LIVED_JVM
        if failpoints:
            env["PGSUB_FAILPOINTS"] = failpoints
        if temp is not None:  # its TMPDIR (the Spark JVM's scratch is under it)
            env["TMPDIR"] = str(temp)
        self.log_path = config.with_suffix(f".{int(time.time() * 1000)}.log")
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "subscriber.runtime.cli", "run", "-c", str(config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: kill() takes the JVM along
        )

    def get(self, route: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{route}", timeout=5) as reply:
                body = reply.read()
                status = reply.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read(), exc.code
        except http.client.HTTPException as exc:
            # A daemon killed (a failpoint) while it answered: to a poller, as if it were
            # not listening (an OSError), not a failure of the test.
            raise ConnectionError(f"the reply to {route} was cut off: {exc!r}") from exc
        return status, (json.loads(body) if route != "/metrics" else body.decode())

    def ready(self) -> bool:
        try:
            return self.get("/readyz")[0] == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"pgsub exited with {self.process.returncode}:\n{self.logs()}")
            return self.ready()

        wait_until(ready, timeout=timeout, interval=0.5, what="pgsub to stream")

    def wait_exit(self, timeout: float = 180) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pgsub did not exit:\n{self.logs()}") from None

    def terminate(self, timeout: float = 120) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        """SIGKILL the daemon and everything it started (the Spark JVM)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-6000:]

    def events(self) -> list[dict[str, Any]]:
        self._log.flush()
        found = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found


def every_table_ready(daemon: DaemonProcess, tables: int) -> bool:
    """Whether ``daemon``'s ``/status`` shows ``tables`` tables, each READY (it must run)."""
    if daemon.process.poll() is not None:
        raise AssertionError(f"pgsub exited with {daemon.process.returncode}:\n{daemon.logs()}")
    try:
        body = daemon.get("/status")[1]
    except OSError:
        return False
    states = [t["state"] for s in body.get("subscriptions", []) for t in s.get("tables") or []]
    return len(states) == tables and set(states) == {"ready"}


def group_commands(group: int) -> list[str]:
    """The command names of the processes in process group ``group``."""
    names = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :]
        if int(rest.split()[2]) == group:
            names.append(name)
    return names


def wait_confirmed(publisher: PgDatabase, slot: str = "sub1", timeout: float = 180) -> None:
    """Wait until the slot confirms everything the publisher has written so far."""
    target = str(publisher.wal_end())

    def confirmed() -> bool:
        return bool(
            publisher.fetchval(
                "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = %s",
                [target, slot],
            )
        )

    wait_until(confirmed, timeout=timeout, interval=0.5, what=f"slot {slot} to confirm {target}")
