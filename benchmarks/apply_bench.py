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
Delta warehouse (``--warehouse-in s3``: a bucket of versitygw, a real S3
gateway on this machine). Each has its own table and publication, so neither decodes
the other's changes. Nothing here is a test: it prints a table and writes
JSON (``--out``).

    python -m benchmarks.apply_bench --rows 1000000 --rate 3000 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    TABLE,
    BenchWarehouse,
    PgsubRun,
    daemon_session,
    discard_cluster,
    long_load_publisher,
    lsn_of,
    percentile,
    steady_load,
    stop_on_sigterm,
    wait_for,
    write_results,
)
from benchmarks.memory import jvm_peak_rss_mb, jvm_text
from subscriber.replication.catalog import wal_end
from subscriber.replication.lsn import Lsn
from subscriber.replication.stream import ReplicationConnection
from subscriber.runtime.daemon import tune_garbage_collector
from subscriber.runtime.embedded import PgCluster

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
                target = wal_end(pub)
            figures.update_seconds = wait_for(applied, target)
            figures.update_rows_per_s = args.rows / figures.update_seconds
            if args.seconds:
                lags, tps, kept, _ = steady_load(
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
        discard_cluster(subscriber)
    return figures


def run_pgsub(
    publisher: PgCluster, args: argparse.Namespace, spark: Any, warehouse: BenchWarehouse
) -> Figures:
    figures = Figures(f"pgsub ({warehouse.kind})")
    batch = {
        "max_changes": args.max_changes,
        "max_delay": args.max_delay,
        "min_changes": args.min_changes,
    }
    with PgsubRun(
        spark,
        warehouse=warehouse if warehouse.kind != "disk" else None,
        connection=publisher.dsn("bench"),
        publications=["pub_pgsub"],
        batch=batch,
    ) as run:
        with publisher.connect("bench") as pub:
            loaded = wal_end(pub)
        started = time.monotonic()
        run.start()
        # The N-row load was written after pgsub's slot was made: it arrives as one transaction.
        wait_for(run.position, loaded)
        figures.initial_rows_per_s = args.rows / (time.monotonic() - started)
        figures.notes.append(
            "initial rows arrive as one streamed INSERT transaction (no table sync yet)"
        )
        requests = warehouse.requests()
        with publisher.connect("bench") as pub:
            pub.execute("UPDATE bench_pgsub SET n = n + 1")
            target = wal_end(pub)
        figures.update_seconds = wait_for(run.position, target)
        figures.update_rows_per_s = args.rows / figures.update_seconds
        if warehouse.server is not None:
            figures.notes.append(
                f"the catch-up's requests to the store: {warehouse.request_mix(requests)}"
            )
        if args.seconds:
            lags, tps, kept, _ = steady_load(
                publisher,
                "bench_pgsub",
                rate=args.rate,
                seconds=args.seconds,
                rows=args.rows,
                position=run.position,
            )
            figures.lag_p50, figures.lag_p99 = percentile(lags, 0.5), percentile(lags, 0.99)
            figures.lag_max, figures.tps_achieved, figures.kept_up = max(lags, default=0), tps, kept
        figures.peak_rss_python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        figures.peak_rss_jvm_mb = jvm_peak_rss_mb()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=3000, help="pgbench transactions per second")
    parser.add_argument("--seconds", type=int, default=60, help="steady load duration (0: skip)")
    parser.add_argument("--max-changes", type=int, default=100_000)
    parser.add_argument("--max-delay", type=float, default=1.0)
    parser.add_argument(
        "--min-changes", type=int, default=1000, help="batch.min_changes (0: max_delay only)"
    )
    parser.add_argument(
        "--warehouse-in",
        choices=("disk", "s3"),
        default="disk",
        help="disk, or s3: a bucket of versitygw, a real S3 gateway (make tools builds it)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/apply.json"))
    args = parser.parse_args()
    stop_on_sigterm()

    publisher = long_load_publisher()
    try:
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
        warehouse = BenchWarehouse(args.warehouse_in)
        try:
            conf = warehouse.spark_conf
            spark = daemon_session(conf)
            tune_garbage_collector()  # as `pgsub run` does
            ours = run_pgsub(publisher, args, spark, warehouse)
        finally:
            warehouse.close()
        print(json.dumps(asdict(ours), indent=2), flush=True)
    finally:
        discard_cluster(publisher)
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
    print(f"batch {args.max_changes} changes / {args.max_delay}s / due at {args.min_changes}")
    print("| figure | pgsub | PostgreSQL 15 subscriber | pgsub / PostgreSQL |\n|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:,.2f} | {b:,.2f} | {ratio(a, b)} |")
    print(f"| (b) kept up | {ours.kept_up} | {native.kept_up} | |")
    memory = f"{ours.peak_rss_python_mb or 0:.0f} / {jvm_text(ours.peak_rss_jvm_mb)}"
    print(f"| peak RSS python / JVM (MB) | {memory} | - | |")
    write_results(args, ours, native)


if __name__ == "__main__":
    main()
