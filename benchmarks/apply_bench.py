"""Apply benchmark: pgsub beside PostgreSQL's own subscriber, in one run.

Scenarios (issue: leader apply worker):

(a) one UPDATE of every row of an N-row table (default 1,000,000) in one
    transaction: seconds from the publisher's COMMIT until the subscriber
    has it durably applied; rows/s.
(b) pgbench single-row updates at a fixed rate (default 3,000/s for 60 s):
    commit-to-applied lag, sampled every 100 ms as (time, publisher WAL
    insert position) and matched with the moment the subscriber's durable
    position passed it; p50 / p99 / max, and whether it kept up.

The native subscriber is a second PostgreSQL 15 cluster (``CREATE
SUBSCRIPTION``); pgsub runs in this process with local Spark and a local
Delta warehouse. Each has its own table and publication, so neither decodes
the other's changes. Nothing here is a test: it prints a table and writes
JSON (``--out``).

    python -m benchmarks.apply_bench --rows 1000000 --rate 3000 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from apply.delta.session import SparkSettings, build_session
from apply.delta.state_store import CheckpointStore
from subscriber.metrics import Metrics
from subscriber.replication.lsn import Lsn
from subscriber.replication.stream import ReplicationConnection
from subscriber.runtime.config import SubscriptionConfig
from subscriber.runtime.daemon import tune_garbage_collector
from subscriber.runtime.embedded import PgCluster, bin_dir
from subscriber.runtime.subscription import SubscriptionRunner

TABLE = """
CREATE TABLE {name} (
    id bigint PRIMARY KEY, n int NOT NULL, t text, ts timestamptz, amount numeric(12, 2)
)
"""
LOAD = (
    "INSERT INTO {name} SELECT g, 0, md5(g::text), now(), g / 100.0"
    " FROM generate_series(1, {rows}) g"
)


@dataclass
class Figures:
    subscriber: str
    initial_rows_per_s: float | None = None
    update_seconds: float = 0.0
    update_rows_per_s: float = 0.0
    lag_p50: float = 0.0
    lag_p99: float = 0.0
    lag_max: float = 0.0
    kept_up: bool = False
    tps_achieved: float = 0.0
    peak_rss_python_mb: float | None = None
    peak_rss_jvm_mb: float | None = None
    notes: list[str] = field(default_factory=list)


def lsn_of(conn: psycopg.Connection[Any], query: str) -> Lsn:
    row = conn.execute(query).fetchone()
    return Lsn.parse(str(row[0])) if row and row[0] else Lsn(0)


def wait_for(position: Callable[[], Lsn], target: Lsn, timeout: float = 3600) -> float:
    """Seconds until ``position()`` reaches ``target``."""
    started = time.monotonic()
    while position() < target:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"did not reach {target} in {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - started


def steady_load(
    publisher: PgCluster,
    table: str,
    *,
    rate: int,
    seconds: int,
    rows: int,
    position: Callable[[], Lsn],
) -> tuple[list[float], float, bool]:
    """pgbench at ``rate`` tx/s; lag samples (s), achieved tx/s, whether it kept up."""
    script = Path(tempfile.mkdtemp()) / "update.sql"
    script.write_text(
        f"\\set id random(1, {rows})\nUPDATE {table} SET n = n + 1, ts = now() WHERE id = :id;\n"
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
                samples.append(
                    (time.monotonic(), lsn_of(conn, "SELECT pg_current_wal_insert_lsn()"))
                )
                time.sleep(0.1)

    def observe() -> None:
        pending = 0
        while not done.is_set() or pending < len(samples):
            now, current = time.monotonic(), position()
            while pending < len(samples) and samples[pending][1] <= current:
                lags.append(now - samples[pending][0])
                pending += 1
            if done.is_set() and pending < len(samples) and now - samples[-1][0] > 120:
                break  # did not catch up within two minutes of the end
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
    kept_up = len(lags) == len(samples) and (max(lags) if lags else 0) < 30
    return lags, tps, kept_up


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def jvm_peak_rss_mb() -> float | None:
    """VmHWM of this process's Spark driver JVM."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"java" in cmdline and f"PPid:\t{os.getpid()}" in status:
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    return None


def run_native(publisher: PgCluster, args: argparse.Namespace) -> Figures:
    figures = Figures("PostgreSQL 15 subscriber")
    subscriber = PgCluster(major=15).start()
    try:
        with subscriber.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with subscriber.connect("bench") as conn:
            conn.execute(TABLE.format(name="bench_native"))
            started = time.monotonic()
            conn.execute(
                f"CREATE SUBSCRIPTION native CONNECTION '{publisher.dsn('bench')}'"
                " PUBLICATION pub_native"
            )
            while conn.execute(
                "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
            ).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.1)
            figures.initial_rows_per_s = args.rows / (time.monotonic() - started)

            def applied() -> Lsn:
                return lsn_of(
                    conn,
                    "SELECT remote_lsn FROM pg_replication_origin_status s"
                    " JOIN pg_subscription p ON s.external_id = 'pg_' || p.oid",
                )

            with publisher.connect("bench") as pub:
                pub.execute("UPDATE bench_native SET n = n + 1")
                target = lsn_of(pub, "SELECT pg_current_wal_insert_lsn()")
            figures.update_seconds = wait_for(applied, target)
            figures.update_rows_per_s = args.rows / figures.update_seconds
            if args.seconds:
                lags, tps, kept = steady_load(
                    publisher,
                    "bench_native",
                    rate=args.rate,
                    seconds=args.seconds,
                    rows=args.rows,
                    position=applied,
                )
                figures.lag_p50, figures.lag_p99 = percentile(lags, 0.5), percentile(lags, 0.99)
                figures.lag_max, figures.tps_achieved, figures.kept_up = (
                    max(lags, default=0),
                    tps,
                    kept,
                )
            conn.execute("ALTER SUBSCRIPTION native DISABLE")
    finally:
        subscriber.destroy()
    return figures


def run_pgsub(publisher: PgCluster, args: argparse.Namespace, spark: Any) -> Figures:
    figures = Figures("pgsub")
    warehouse = Path(tempfile.mkdtemp(prefix="pgsub-bench-wh-"))
    config = SubscriptionConfig(
        name="bench",
        connection=publisher.dsn("bench"),
        publications=["pub_pgsub"],
        copy_data=False,
        status_interval=1.0,
        batch={"max_changes": args.max_changes, "max_delay": args.max_delay},
    )
    runner = SubscriptionRunner(
        config, spark, str(warehouse), CheckpointStore(spark, str(warehouse)), Metrics()
    )
    stopping = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stopping,), daemon=True)

    applied = _durable(runner)
    try:
        with publisher.connect("bench") as pub:
            loaded = lsn_of(pub, "SELECT pg_current_wal_insert_lsn()")
        started = time.monotonic()
        thread.start()
        # The N-row load was written after pgsub's slot was made: it arrives as one transaction.
        wait_for(applied, loaded)
        figures.initial_rows_per_s = args.rows / (time.monotonic() - started)
        figures.notes.append(
            "initial rows arrive as one streamed INSERT transaction (no table sync yet)"
        )
        with publisher.connect("bench") as pub:
            pub.execute("UPDATE bench_pgsub SET n = n + 1")
            target = lsn_of(pub, "SELECT pg_current_wal_insert_lsn()")
        figures.update_seconds = wait_for(applied, target)
        figures.update_rows_per_s = args.rows / figures.update_seconds
        if args.seconds:
            lags, tps, kept = steady_load(
                publisher,
                "bench_pgsub",
                rate=args.rate,
                seconds=args.seconds,
                rows=args.rows,
                position=applied,
            )
            figures.lag_p50, figures.lag_p99 = percentile(lags, 0.5), percentile(lags, 0.99)
            figures.lag_max, figures.tps_achieved, figures.kept_up = max(lags, default=0), tps, kept
        figures.peak_rss_python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        figures.peak_rss_jvm_mb = jvm_peak_rss_mb()
    finally:
        stopping.set()
        thread.join(timeout=300)
        shutil.rmtree(warehouse, ignore_errors=True)
    return figures


def _durable(runner: SubscriptionRunner) -> Callable[[], Lsn]:
    """pgsub's durable position: flushed, or everything received when nothing is pending."""

    def position() -> Lsn:
        progress = runner.progress
        if progress is None:
            return Lsn(0)
        return progress.received if progress.idle else progress.flushed

    return position


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=3000, help="pgbench transactions per second")
    parser.add_argument("--seconds", type=int, default=60, help="steady load duration (0: skip)")
    parser.add_argument("--max-changes", type=int, default=100_000)
    parser.add_argument("--max-delay", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/apply.json"))
    args = parser.parse_args()

    publisher = PgCluster(
        major=15, settings={"max_wal_size": "4GB", "checkpoint_timeout": "30min"}
    ).start()
    try:
        with publisher.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with publisher.connect("bench") as conn:
            for name in ("bench_native", "bench_pgsub"):
                conn.execute(TABLE.format(name=name))
            conn.execute("CREATE PUBLICATION pub_native FOR TABLE bench_native")
            conn.execute("CREATE PUBLICATION pub_pgsub FOR TABLE bench_pgsub")
        with ReplicationConnection(publisher.dsn("bench")) as replication:
            replication.create_slot("bench")
        with publisher.connect("bench") as conn:
            for name in ("bench_native", "bench_pgsub"):
                conn.execute(LOAD.format(name=name, rows=args.rows))
            conn.execute("VACUUM ANALYZE")
        native = run_native(publisher, args)
        print(json.dumps(asdict(native), indent=2), flush=True)
        spark = build_session(SparkSettings(master="local[*]"))
        tune_garbage_collector()  # as `pgsub run` does
        ours = run_pgsub(publisher, args, spark)
        print(json.dumps(asdict(ours), indent=2), flush=True)
    finally:
        publisher.destroy()
    report(args, native, ours)


def report(args: argparse.Namespace, native: Figures, ours: Figures) -> None:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"

    rows = [
        (
            "(a) 1 UPDATE of N rows: rows/s commit->applied",
            ours.update_rows_per_s,
            native.update_rows_per_s,
        ),
        ("(a) seconds commit->applied", ours.update_seconds, native.update_seconds),
        ("(b) steady load lag p50 (s)", ours.lag_p50, native.lag_p50),
        ("(b) steady load lag p99 (s)", ours.lag_p99, native.lag_p99),
        ("(b) steady load lag max (s)", ours.lag_max, native.lag_max),
        ("(b) pgbench tps achieved", ours.tps_achieved, native.tps_achieved),
    ]
    print(f"\nrows={args.rows} rate={args.rate}/s for {args.seconds}s,", end=" ")
    print(f"batch {args.max_changes} changes / {args.max_delay}s")
    print("| figure | pgsub | PostgreSQL 15 subscriber | pgsub / PostgreSQL |\n|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:,.2f} | {b:,.2f} | {ratio(a, b)} |")
    print(f"| (b) kept up | {ours.kept_up} | {native.kept_up} | |")
    memory = f"{ours.peak_rss_python_mb or 0:.0f} / {ours.peak_rss_jvm_mb or 0:.0f}"
    print(f"| peak RSS python / JVM (MB) | {memory} | - | |")
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


if __name__ == "__main__":
    main()
