"""What the benchmarks share: the bench table, positions, waits, the steady load, pgsub's run
(memory figures: ``benchmarks.memory``).

``PgsubRun`` runs a subscription the way the daemon does (``SubscriptionRunner``
on a thread, local Spark, a temporary warehouse, optionally its maintenance
thread) and gives its durable position: what the benchmarks time pgsub by,
as PostgreSQL's subscriber (``NativeRun``) is timed by its replication
origin's ``remote_lsn``.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import psycopg

from apply.delta.spark.session import SparkSettings, lazy_session
from apply.delta.state_store import CheckpointStore
from subscriber.metrics import Metrics
from subscriber.replication.catalog import wal_end
from subscriber.replication.lsn import Lsn
from subscriber.runtime.config import MaintenanceConfig, SubscriptionConfig
from subscriber.runtime.embedded import PgCluster, bin_dir
from subscriber.runtime.maintenance import Maintenance
from subscriber.runtime.subscription import SubscriptionRunner

TABLE = """
CREATE TABLE {name} (
    id bigint PRIMARY KEY, n int NOT NULL, t text, ts timestamptz, amount numeric(12, 2)
)
"""


# The folder a benchmark's used folders are moved into (``discard``): the suite's, shared by
# its scenarios' processes and emptied once they have all run; else this process's own,
# emptied as it exits. Not ``PGSUB_...``: a ``pgsub run`` a scenario starts inherits it, and
# reads every such variable as a config key (``subscriber.runtime.config_file``).
TRASH_VARIABLE = "BENCH_PGSUB_TRASH"


def discard(folder: Path | str) -> None:
    """``folder``, which the benchmark made and no longer needs, moved aside now and removed
    once every scenario has run (``TRASH_VARIABLE``), not between two measurements.

    On a file system without a journal (this machine's root: ext4, no journal) a file's
    creation passes over every inode of its block group freed in the last minutes (the
    kernel's ``recently_deleted``, which a journaled ext4 skips): after a clean-up of a few
    thousand files, 0.2-0.9 ms of kernel time a file for minutes, against 0.02 ms. pgsub
    creates three files a table a batch and PostgreSQL's subscriber none, so a scenario
    measured right after another one's clean-up (PostgreSQL's subscriber's cluster, the
    previous scenario's) charged it to pgsub alone (docs/performance.md, "The file system
    under the benchmarks")."""
    path = Path(folder)
    if not path.exists():
        return
    try:
        path.rename(_trash() / uuid.uuid4().hex)
    except OSError:  # on another file system, or not this user's to move
        shutil.rmtree(path, ignore_errors=True)


def discard_cluster(cluster: PgCluster) -> None:
    """``cluster`` stopped at once, its folder ``discard``-ed."""
    cluster.stop("immediate")
    discard(cluster.root)


def _trash() -> Path:
    shared = os.environ.get(TRASH_VARIABLE)
    return Path(shared) if shared else _own_trash()


@functools.cache
def _own_trash() -> Path:
    """This process's trash folder, made at its first ``discard`` and removed as it exits."""
    trash = Path(tempfile.mkdtemp(prefix="pgsub-bench-trash-"))
    atexit.register(shutil.rmtree, trash, ignore_errors=True)
    return trash


@contextmanager
def shared_trash() -> Iterator[None]:
    """Within the block, every benchmark process started discards into one folder, removed
    when the block ends (``benchmarks.suite``'s scenarios)."""
    trash = tempfile.mkdtemp(prefix="pgsub-bench-trash-")
    os.environ[TRASH_VARIABLE] = trash
    try:
        yield
    finally:
        del os.environ[TRASH_VARIABLE]
        shutil.rmtree(trash, ignore_errors=True)


def lsn_of(conn: psycopg.Connection[Any], query: str) -> Lsn:
    row = conn.execute(query).fetchone()
    return Lsn.parse(str(row[0])) if row and row[0] else Lsn(0)


def wait_for(
    position: Callable[[], Lsn], target: Lsn, timeout: float = 3600, since: float | None = None
) -> float:
    """Seconds until ``position()`` reaches ``target``, from now or from ``since`` (the
    monotonic clock's time of what started it)."""
    started = time.monotonic() if since is None else since
    while position() < target:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"did not reach {target} in {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - started


class LoadRun(NamedTuple):
    lags: list[float]  # seconds, one per 100-ms sample of the publisher's position
    tps: float  # achieved
    kept_up: bool
    # Seconds from the load's end until its last sample was applied (None: not within
    # drain_timeout).
    drained: float | None


def steady_load(
    publisher: PgCluster,
    table: str,
    *,
    rate: int,
    seconds: int,
    rows: int,
    position: Callable[[], Lsn],
    transaction: str | None = None,
    drain_timeout: float = 120,
) -> LoadRun:
    """pgbench at ``rate`` tx/s; lag samples (s), achieved tx/s, whether it kept up.

    ``transaction``: pgbench's script (default: a random row of ``table`` updated);
    ``drain_timeout``: how long after the load the lag is still followed."""
    script = Path(tempfile.mkdtemp()) / "update.sql"
    script.write_text(
        transaction
        or f"\\set id random(1, {rows})\nUPDATE {table} SET n = n + 1, ts = now() WHERE id = :id;\n"
    )
    os.chmod(script.parent, 0o755)  # noqa: S103 - pgbench may run as the server user
    os.chmod(script, 0o644)
    pgbench = [
        str(bin_dir(15) / "pgbench"),
        "-n", "-c", "4", "-j", "2", "-R", str(rate), "-T", str(seconds), "-f", str(script),
        "-h", "127.0.0.1", "-p", str(publisher.port), "-U", "postgres", "bench",
    ]  # fmt: skip
    samples: list[tuple[float, Lsn]] = []
    lags: list[float] = []
    done = threading.Event()

    def sample() -> None:
        with publisher.connect("bench") as conn:
            while not done.is_set():
                samples.append((time.monotonic(), wal_end(conn)))
                time.sleep(0.1)

    def observe() -> None:
        pending = 0
        while not done.is_set() or pending < len(samples):
            now, current = time.monotonic(), position()
            while pending < len(samples) and samples[pending][1] <= current:
                lags.append(now - samples[pending][0])
                pending += 1
            if done.is_set() and pending < len(samples) and now - samples[-1][0] > drain_timeout:
                break  # did not catch up within drain_timeout of the end
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    observer = threading.Thread(target=observe, daemon=True)
    sampler.start()
    observer.start()
    result = subprocess.run(pgbench, check=True, capture_output=True, text=True)  # noqa: S603
    done.set()
    sampler.join()
    observer.join()
    tps = 0.0
    for line in result.stdout.splitlines():
        if line.startswith("tps = "):
            tps = float(line.split()[2])
    applied = len(lags) == len(samples)
    kept_up = applied and (max(lags) if lags else 0) < 30
    return LoadRun(lags, tps, kept_up, lags[-1] if applied and lags else None)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def destroyed_if_unfinished(cluster: PgCluster) -> Iterator[PgCluster]:
    """``cluster`` while it is made ready, destroyed if that fails or is stopped (SIGTERM,
    Ctrl-C): the benchmark's own ``finally`` holds it only once it is handed over."""
    try:
        yield cluster
    except BaseException:
        discard_cluster(cluster)
        raise


def long_load_publisher() -> PgCluster:
    """A PostgreSQL 15 publisher with an empty database ``bench``, its WAL kept through
    loads of millions of rows (no checkpoint in their middle)."""
    publisher = PgCluster(
        major=15, settings={"max_wal_size": "4GB", "checkpoint_timeout": "30min"}
    ).start()
    with destroyed_if_unfinished(publisher), publisher.connect() as conn:
        conn.execute("CREATE DATABASE bench")
    return publisher


def bench_publisher(rows: int, names: Sequence[str], **settings: str) -> PgCluster:
    """A PostgreSQL 15 publisher with database ``bench``: per name a table of ``rows`` rows
    (``TABLE``) and a publication ``pub_<name>``."""
    publisher = PgCluster(major=15, settings={"max_wal_size": "4GB", **settings}).start()
    with destroyed_if_unfinished(publisher), publisher.connect() as conn:
        conn.execute("CREATE DATABASE bench")
    with destroyed_if_unfinished(publisher), publisher.connect("bench") as conn:
        for name in names:
            conn.execute(TABLE.format(name=name))
            conn.execute(
                f"INSERT INTO {name} SELECT g, 0, md5(g::text), now(), g / 100.0"
                f" FROM generate_series(1, {rows}) g"
            )
            conn.execute(f"CREATE PUBLICATION pub_{name} FOR TABLE {name}")
        conn.execute("VACUUM ANALYZE")
    return publisher


class NativeRun:
    """PostgreSQL's own subscriber of ``pub_<table>`` on a second cluster, READY on entry."""

    def __init__(self, publisher: PgCluster, table: str) -> None:
        self.subscriber = PgCluster(major=15).start()
        with self.subscriber.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        self._conn = self.subscriber.connect("bench")
        self._conn.execute(TABLE.format(name=table))
        self._conn.execute(
            f"CREATE SUBSCRIPTION native CONNECTION '{publisher.dsn('bench')}'"
            f" PUBLICATION pub_{table}"
        )

    def __enter__(self) -> NativeRun:
        while self._conn.execute(
            "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
        ).fetchone()[0]:  # type: ignore[index]
            time.sleep(0.1)
        return self

    def position(self) -> Lsn:
        return lsn_of(
            self._conn,
            "SELECT remote_lsn FROM pg_replication_origin_status s"
            " JOIN pg_subscription p ON s.external_id = 'pg_' || p.oid",
        )

    def __exit__(self, *exc: object) -> None:
        self._conn.execute("ALTER SUBSCRIPTION native DISABLE")
        self._conn.execute("ALTER SUBSCRIPTION native SET (slot_name = NONE)")
        self._conn.execute("DROP SUBSCRIPTION native")
        self._conn.close()
        discard_cluster(self.subscriber)


def writer_processes(value: str) -> int | str:
    """``--writer-processes``: ``auto`` or a number of processes (0: the threads)."""
    return value if value == "auto" else int(value)


class PgsubRun:
    """One subscription of pgsub, run as the daemon runs it, with a temporary warehouse
    (``warehouse``: the one an earlier run kept, kept again)."""

    def __init__(
        self,
        spark: Any,
        *,
        warehouse: Path | BenchWarehouse | None = None,
        sees_warehouse: bool | None = None,
        maintenance: MaintenanceConfig | None = None,
        **settings: Any,
    ) -> None:
        """``maintenance``: the daemon's maintenance thread, started with ``start``; its
        policy is the one the subscription creates its tables with, as in the daemon (a
        table created with another retention has its properties set by the first round: a
        Spark commit a table, each holding the table's batches)."""
        self._keeps = warehouse is not None
        self.maintenance = maintenance
        if isinstance(warehouse, BenchWarehouse):  # a folder or a bucket, which it owns
            self.location = warehouse.location
            self.warehouse = warehouse.disk_folder  # its bytes, on this machine
        else:
            self.warehouse = warehouse or Path(tempfile.mkdtemp(prefix="pgsub-bench-wh-"))
            self.location = str(self.warehouse)
        self.spool = Path(tempfile.mkdtemp(prefix="pgsub-bench-spool-"))
        self.config = SubscriptionConfig(
            **{"name": "bench", "copy_data": False, "status_interval": 1.0, **settings},
            spool_dir=self.spool,
        )
        self.metrics = Metrics()
        self._spark = spark
        self.runner = SubscriptionRunner(
            self.config,
            spark,
            self.location,
            CheckpointStore(spark, self.location),
            self.metrics,
            maintenance=(maintenance or MaintenanceConfig()).policy(),
            spark_sees_warehouse=sees_warehouse,
        )
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self.runner.run, args=(self._stopping,), daemon=True)

    def start(self) -> PgsubRun:
        """Start replicating; with ``maintenance``, the daemon's maintenance thread too."""
        self._thread.start()
        maintenance = self.maintenance
        if maintenance is not None:
            tending = Maintenance(
                [self.runner], self._spark, self.location, maintenance, self.metrics
            )
            threading.Thread(target=tending.run, args=(self._stopping,), daemon=True).start()
        return self

    def wait_ready(self) -> None:
        """Until every table of the subscription is READY."""
        from tablesync.state import TableState

        while True:
            statuses = self.runner.coordinator.statuses
            if statuses and all(s.state is TableState.READY for s in statuses):
                return
            time.sleep(0.05)

    def position(self) -> Lsn:
        """The durable position: flushed, or everything received when nothing is pending."""
        progress = self.runner.progress
        if progress is None:
            return Lsn(0)
        return progress.done_through

    def __enter__(self) -> PgsubRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=300)
        if not self._keeps:
            discard(self.warehouse)
        discard(self.spool)


def daemon_session(conf: dict[str, str] | None = None) -> Any:
    """A local Spark session held as `pgsub run` holds it (`spark.start: on_demand`, the
    default): its JVM starts only once a table needs Spark, and counts in the figures then."""
    return lazy_session(SparkSettings(master="local[*]", conf=conf or {}))


def stop_on_sigterm() -> None:
    """A benchmark stopped with SIGTERM (``kill``, a CI timeout) unwinds as one stopped
    with Ctrl-C does: its ``finally`` blocks stop the PostgreSQL clusters, pgbench and the
    Spark it started, which Python's default SIGTERM would leave running."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def write_results(args: argparse.Namespace, ours: Any, native: Any) -> None:
    """A benchmark's arguments and both subscribers' figures (dataclasses) as JSON in
    ``args.out``."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "pgsub": asdict(ours),
                "native": asdict(native),
            },
            indent=2,
        )
    )


class BenchWarehouse:
    """Where a benchmark's pgsub writes: a temporary folder (``disk``), or a bucket of
    versitygw, a real S3 gateway over a temporary folder (``s3``; ``make tools`` builds it),
    reached through the one storage configuration the daemon uses. ``disk_folder`` is
    where its bytes are on this machine either way; ``requests`` counts the gateway's."""

    def __init__(self, kind: str) -> None:
        from apply.delta.files.storage import register
        from tests.plugins.s3 import start_s3_server

        self.kind = kind
        self._scratch = Path(tempfile.mkdtemp(prefix=f"pgsub-bench-{kind}-"))
        self.server = None
        self.spark_conf: dict[str, str] = {}
        if kind == "disk":
            self.location = str(self._scratch / "warehouse")
            self.disk_folder = Path(self.location)
            return
        self.access_log = self._scratch / "access.log"
        self.server = start_s3_server(self._scratch / "root", access_log=self.access_log)
        self.server.bucket("bench")
        self.location = "s3a://bench/wh"
        self.disk_folder = self._scratch / "root" / "bench" / "wh"
        storage = self.server.storage()
        register(self.location, storage)
        self.spark_conf = storage.spark_conf()

    def requests(self) -> int:
        """The requests the gateway answered so far (0 for a folder)."""
        if self.server is None or not self.access_log.exists():
            return 0
        with self.access_log.open("rb") as log:
            return sum(1 for _ in log)

    def request_mix(self, since: int = 0) -> dict[str, int]:
        """The gateway's requests after the first ``since``, by operation and what they
        touched (``GetObject data``, ``PutObject commit``, ``HeadObject state``, ...)."""
        from tests.plugins.s3 import logged_requests, object_kind

        if self.server is None or not self.access_log.exists():
            return {}
        made = logged_requests(self.access_log)[since:]
        mix = Counter(f"{operation} {object_kind(key)}" for operation, key in made)
        return dict(mix.most_common())

    def commits(self) -> int:
        """The commits made to every table of the warehouse so far."""
        return sum(1 for _ in self.disk_folder.glob("*/*/_delta_log/*.json"))

    def close(self) -> None:
        from tests.plugins.s3 import stop_s3_server

        if self.server is not None:
            stop_s3_server(self.server)
        discard(self._scratch)


def folder_bytes(path: Path) -> int:
    """The bytes of every file under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
