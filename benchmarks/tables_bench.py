"""Many tables: pgsub beside PostgreSQL's own subscriber on a database of N small tables.

A real application database has hundreds of tables. Scenarios, in one run:

(a) initial sync of N tables (default 200) of R rows each (default 2,000):
    seconds from the subscription's start until every table is READY;
(b) single-row updates at a fixed rate (default 1,000/s for 120 s), each to
    a random row of a random table: commit-to-applied lag at the slot
    (sampled every 100 ms as the publisher's WAL insert position, matched
    with the moment the subscriber's durable position passed it), p50 / p99
    / max, and the drain: how long after the load the last sample was applied.

pgsub confirms the slot only after the Delta commits (docs/architecture.md,
"Durability"), so its lag at the slot is its lag in the tables. Each
subscriber has its own schema of tables and its own publication (``FOR
TABLES IN SCHEMA``), so neither applies the other's changes; they run one
after the other. Nothing here is a test: it prints a table and writes JSON.

    python -m benchmarks.tables_bench --tables 200 --rows 2000 --rate 1000 --seconds 120

A long run: ``--window`` reports lag and the daemon's memory per window of
minutes, ``--maintenance-interval`` runs pgsub's maintenance beside the load
(retention one hour, so its VACUUMs come within the run):

    python -m benchmarks.tables_bench --seconds 2400 --window 5 --maintenance-interval 300 \
        --warehouse-in s3
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
    destroyed_if_unfinished,
    discard_cluster,
    folder_bytes,
    lsn_of,
    percentile,
    steady_load,
    stop_on_sigterm,
    write_results,
    writer_processes,
)
from benchmarks.memory import ResidentMemory, WriterMemory, jvm_peak_rss_mb, writer_peaks_mb
from benchmarks.soak import windows
from subscriber.replication.lsn import Lsn
from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.daemon import tune_garbage_collector
from subscriber.runtime.embedded import PgCluster

SCHEMAS = ("native", "ours")
# One UPDATE of a random row of a random table of a schema (pgbench cannot name a table).
BUMP = """
CREATE FUNCTION {schema}.bump(t int, id bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('UPDATE {schema}.%I SET n = n + 1, ts = now() WHERE id = $1', 't' || t)
    USING id;
END $$
"""


@dataclass
class Figures:
    subscriber: str
    sync_seconds: float = 0.0
    lag_p50: float = 0.0
    lag_p99: float = 0.0
    lag_max: float = 0.0
    drain_seconds: float | None = None
    kept_up: bool = False
    tps_achieved: float = 0.0
    peak_rss_python_mb: float | None = None
    peak_rss_jvm_mb: float | None = None
    # What the warehouse grew by during the load, per hour (nothing is vacuumed in the run).
    warehouse_gb_per_hour: float | None = None
    # In an object store: the requests the load made, per table per batch.
    requests_per_table_batch: float | None = None
    # ... and by what they were: operation and object ("GetObject data": per table per batch).
    request_mix: dict[str, float] = field(default_factory=dict)
    # With --window: lag p50 / p99 / max and the daemon's resident memory (MB) per window.
    windows: list[dict[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def table_name(schema: str, index: int) -> str:
    return f"{schema}.t{index}"


def publisher_with_tables(args: argparse.Namespace) -> PgCluster:
    publisher = PgCluster(
        major=15,
        settings={
            "max_wal_size": "4GB",
            "checkpoint_timeout": "30min",
            "max_replication_slots": str(args.tables + 20),
            "max_wal_senders": str(args.tables + 20),
        },
    ).start()
    with destroyed_if_unfinished(publisher), publisher.connect() as conn:
        conn.execute("CREATE DATABASE bench")
    with destroyed_if_unfinished(publisher), publisher.connect("bench") as conn:
        for schema in SCHEMAS:
            conn.execute(f"CREATE SCHEMA {schema}")
            for i in range(1, args.tables + 1):
                name = table_name(schema, i)
                conn.execute(TABLE.format(name=name))
                conn.execute(
                    f"INSERT INTO {name} SELECT g, 0, md5(g::text), now(), g / 100.0"
                    f" FROM generate_series(1, {args.rows}) g"
                )
            conn.execute(BUMP.format(schema=schema))
            conn.execute(f"CREATE PUBLICATION pub_{schema} FOR TABLES IN SCHEMA {schema}")
        conn.execute("VACUUM ANALYZE")
    return publisher


def load_script(schema: str, args: argparse.Namespace) -> str:
    return (
        f"\\set t random(1, {args.tables})\n\\set id random(1, {args.rows})\n"
        f"SELECT {schema}.bump(:t, :id);\n"
    )


def _apply_load(
    figures: Figures, publisher: PgCluster, schema: str, args: argparse.Namespace, position: Any
) -> None:
    memory = ResidentMemory(interval=5.0)
    with memory:
        lags, tps, kept, drained = steady_load(
            publisher,
            schema,
            rate=args.rate,
            seconds=args.seconds,
            rows=args.rows,
            position=position,
            transaction=load_script(schema, args),
            drain_timeout=args.drain_timeout,
        )
    if args.window:
        figures.windows = windows(lags, args.window)
        for window, rss in zip(figures.windows, memory.peaks(args.window * 60), strict=False):
            window["rss_mb"] = rss
    if args.lags:
        with args.lags.open("a") as out:  # one line a run: its name and every 100-ms sample
            out.write(json.dumps({"run": figures.subscriber, "lags": lags}) + "\n")
    figures.lag_p50, figures.lag_p99 = percentile(lags, 0.5), percentile(lags, 0.99)
    figures.lag_max, figures.tps_achieved, figures.kept_up = max(lags, default=0), tps, kept
    figures.drain_seconds = drained


def run_native(publisher: PgCluster, args: argparse.Namespace) -> Figures:
    figures = Figures("PostgreSQL 15 subscriber")
    subscriber = PgCluster(
        major=15,
        settings={"max_sync_workers_per_subscription": str(args.sync_workers)},
    ).start()
    try:
        with subscriber.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with subscriber.connect("bench") as conn:
            conn.execute("CREATE SCHEMA native")
            for i in range(1, args.tables + 1):
                conn.execute(TABLE.format(name=table_name("native", i)))
            started = time.monotonic()
            conn.execute(
                f"CREATE SUBSCRIPTION native CONNECTION '{publisher.dsn('bench')}'"
                " PUBLICATION pub_native"
            )
            while conn.execute(
                "SELECT count(*) < %s OR bool_or(srsubstate <> 'r') FROM pg_subscription_rel",
                [args.tables],
            ).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.05)
            figures.sync_seconds = time.monotonic() - started

            def applied() -> Lsn:
                return lsn_of(
                    conn,
                    "SELECT remote_lsn FROM pg_replication_origin_status s"
                    " JOIN pg_subscription p ON s.external_id = 'pg_' || p.oid",
                )

            if args.seconds:
                _apply_load(figures, publisher, "native", args, applied)
            conn.execute("ALTER SUBSCRIPTION native DISABLE")
            conn.execute("ALTER SUBSCRIPTION native SET (slot_name = NONE)")
            conn.execute("DROP SUBSCRIPTION native")
    finally:
        discard_cluster(subscriber)
    return figures


def run_pgsub(
    publisher: PgCluster, args: argparse.Namespace, spark: Any, warehouse: BenchWarehouse
) -> Figures:
    figures = Figures(f"pgsub ({warehouse.kind})")
    figures.notes.append(f"max_sync_workers {args.sync_workers}, as the native subscriber's")
    figures.notes.append(f"history: {args.history}; warehouse: {warehouse.location}")
    figures.notes.append(f"batch.max_delay: {args.max_delay} s, min_changes {args.min_changes}")
    settings: dict[str, Any] = {}
    if args.checkpoint_interval is not None:
        figures.notes.append(f"checkpoint_interval: {args.checkpoint_interval:g} s")
        settings["checkpoint_interval"] = args.checkpoint_interval
    figures.notes.append(f"writer_processes: {args.writer_processes}")
    settings["writer_processes"] = args.writer_processes
    with (
        PgsubRun(
            spark,
            warehouse=warehouse,
            name=f"bench_{warehouse.kind}",
            connection=publisher.dsn("bench"),
            publications=["pub_ours"],
            copy_data=True,
            max_sync_workers=args.sync_workers,
            history={"mode": args.history},
            batch={"max_delay": args.max_delay, "min_changes": args.min_changes},
            maintenance=(
                MaintenanceConfig(interval=args.maintenance_interval, retention=3600)
                if args.maintenance_interval
                else None
            ),
            **settings,
        ) as run,
        WriterMemory(run.runner.tables) as memory,
    ):
        started = time.monotonic()
        run.start()
        if args.maintenance_interval:
            figures.notes.append(f"maintenance every {args.maintenance_interval:g} s, 1 h kept")
        while len(run.runner.coordinator.statuses) < args.tables:
            time.sleep(0.05)
        run.wait_ready()
        figures.sync_seconds = time.monotonic() - started
        if args.seconds:
            before = folder_bytes(run.warehouse)
            requests, commits = warehouse.requests(), warehouse.commits()
            _apply_load(figures, publisher, "ours", args, run.position)
            grown = folder_bytes(run.warehouse) - before
            figures.warehouse_gb_per_hour = grown / 1e9 * 3600 / args.seconds
            table_batches = warehouse.commits() - commits
            if warehouse.kind == "s3" and table_batches:
                made = warehouse.requests() - requests
                figures.requests_per_table_batch = made / table_batches
                figures.request_mix = {
                    kind: round(count / table_batches, 2)
                    for kind, count in warehouse.request_mix(requests).items()
                }
        figures.peak_rss_python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        writers = writer_peaks_mb(run.runner.tables)
        if writers:  # the daemon's Python is its writer processes too
            figures.notes.append(
                f"writer processes: peak RSS {writers} MB each; with their server, peak PSS "
                f"{memory.peak_mb:.0f} MB together, in the Python figure"
            )
            figures.peak_rss_python_mb += memory.peak_mb
        figures.peak_rss_jvm_mb = jvm_peak_rss_mb()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows", type=int, default=2000, help="rows per table")
    parser.add_argument("--rate", type=int, default=1000, help="updates per second, all tables")
    parser.add_argument("--seconds", type=int, default=120, help="load duration (0: skip)")
    parser.add_argument("--sync-workers", type=int, default=4)
    parser.add_argument("--drain-timeout", type=float, default=900)
    parser.add_argument("--max-delay", type=float, default=1.0, help="pgsub's batch.max_delay (s)")
    parser.add_argument(
        "--min-changes",
        type=int,
        default=1000,
        help="pgsub's batch.min_changes (0: max_delay only)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=None,
        help="pgsub's checkpoint_interval (s; default: pgsub's): a batch takes nothing ahead",
    )
    parser.add_argument(
        "--history",
        choices=["mirror", "soft_delete", "changelog", "scd2"],
        default="mirror",
        help="every table's",
    )
    parser.add_argument(
        "--warehouse-in",
        default="disk",
        help="disk, s3 (a bucket of versitygw, a real S3 gateway), or disk,s3: both in one run",
    )
    parser.add_argument(
        "--window", type=float, default=0, help="minutes per reported window of lag (0: none)"
    )
    parser.add_argument(
        "--maintenance-interval",
        type=float,
        default=0,
        help="run pgsub's maintenance every this many seconds, retention 1 hour (0: none)",
    )
    parser.add_argument(
        "--pgsub-only",
        action="store_true",
        help="leave PostgreSQL's subscriber out (before/after runs of pgsub alone)",
    )
    parser.add_argument(
        "--writer-processes",
        type=writer_processes,
        default="auto",
        help="pgsub's writer_processes: auto (the default), 0 (threads) or a number",
    )
    parser.add_argument(
        "--lags", type=Path, help="append each run's lag samples (10 a second) to this file"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/tables.json"))
    args = parser.parse_args()
    stop_on_sigterm()
    publisher = publisher_with_tables(args)
    warehouses: list[BenchWarehouse] = []
    try:  # a warehouse that cannot start (versitygw not built) stops the publisher too
        warehouses.extend(BenchWarehouse(kind) for kind in args.warehouse_in.split(","))
        native = None if args.pgsub_only else run_native(publisher, args)
        if native is not None:
            print(json.dumps(asdict(native), indent=2), flush=True)
        conf = next((w.spark_conf for w in warehouses if w.spark_conf), {})
        # As `pgsub run` holds it (`spark.start: on_demand`, the default): a JVM only once a
        # table needs Spark - these small tables' copies and batches do not.
        spark = daemon_session(conf)
        tune_garbage_collector()  # as `pgsub run` does
        ours = []
        for warehouse in warehouses:  # each its own subscription and slot
            ours.append(run_pgsub(publisher, args, spark, warehouse))
            print(json.dumps(asdict(ours[-1]), indent=2), flush=True)
    finally:
        discard_cluster(publisher)
        for warehouse in warehouses:
            warehouse.close()
    if native is None:  # --pgsub-only: the JSON above
        return
    for figures in ours:
        report(args, native, figures)


def report(args: argparse.Namespace, native: Figures, ours: Figures) -> None:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    print(f"\n{args.tables} tables x {args.rows} rows; {args.rate} updates/s for {args.seconds} s")
    print("| figure | pgsub | PostgreSQL 15 subscriber | PostgreSQL / pgsub |\n|---|---|---|---|")
    print(
        f"| (a) sync, seconds to all READY | {ours.sync_seconds:,.1f} |"
        f" {native.sync_seconds:,.1f} | {ratio(native.sync_seconds, ours.sync_seconds)} |"
    )
    for name, a, b in (
        ("(b) lag p50 (s)", ours.lag_p50, native.lag_p50),
        ("(b) lag p99 (s)", ours.lag_p99, native.lag_p99),
        ("(b) lag max (s)", ours.lag_max, native.lag_max),
        ("(b) updates/s achieved", ours.tps_achieved, native.tps_achieved),
    ):
        print(f"| {name} | {a:,.2f} | {b:,.2f} | |")
    drains = [f"{f.drain_seconds:.1f}" if f.drain_seconds is not None else "not drained"
              for f in (ours, native)]  # fmt: skip
    print(f"| (b) drained after the load (s) | {drains[0]} | {drains[1]} | |")
    print(f"| (b) kept up | {ours.kept_up} | {native.kept_up} | |")
    jvm = ours.peak_rss_jvm_mb
    memory = f"{ours.peak_rss_python_mb or 0:.0f} / {'no JVM' if jvm is None else f'{jvm:.0f}'}"
    print(f"| peak RSS python / JVM (MB) | {memory} | - | |")
    growth = ours.warehouse_gb_per_hour
    growth_text = "-" if growth is None else f"{growth:,.2f}"
    print(f"| (b) warehouse growth, GB/hour, before VACUUM | {growth_text} | - | |")
    if ours.requests_per_table_batch is not None:
        print(f"| requests per table per batch | {ours.requests_per_table_batch:,.1f} | - | |")
        for kind, count in ours.request_mix.items():
            print(f"| - {kind} | {count:,.2f} | - | |")
    if ours.windows:
        print(
            f"\n| window ({args.window:g} min) | lag p50 / p99 / max (s) | peak RSS Python (MB) |"
        )
        print("|---|---|---|")
        for number, window in enumerate(ours.windows, 1):
            rss = window.get("rss_mb")
            print(
                f"| {number} | {window['p50']:.2f} / {window['p99']:.2f} / {window['max']:.2f} |"
                f" {'-' if rss is None else f'{rss:.0f}'} |"
            )
    write_results(args, ours, native)


if __name__ == "__main__":
    main()
