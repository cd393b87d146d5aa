"""Backlog benchmark: a backlog of single-row transactions drained, beside PostgreSQL's
own subscriber, in one run.

Each subscriber is down while pgbench sends ``--transactions`` single-row
UPDATEs of random rows of an N-row table (default 1,000,000) as fast as the
publisher takes them; then it starts, and the figure is the seconds from
its start until it has the backlog durably applied (transactions/s). This
is what a subscriber meets after a restart or an outage, and where a
batch is as large as its bounds: pgsub's batches grow to four times
``batch.max_changes`` while it lags (``apply.core.batch``).

PostgreSQL's subscriber is a second PostgreSQL 15 cluster, disabled during
the load (``ALTER SUBSCRIPTION ... DISABLE``) and enabled after it (its
figure counts from the ENABLE: its worker's start is in it). pgsub
runs in this process with local Spark and a local Delta warehouse: its slot
is made first, the N rows arrive as one streamed INSERT, applied by a
first run that then stops once its slot's restart point is past them (as
PostgreSQL's slot, made after its rows, starts past them); the second run
starts after the load over the same warehouse, and its figure counts from
its start (its start-up is in it, as the ENABLE's is in PostgreSQL's).
Each subscriber has
its own table and publication. Nothing here is a test: it prints a table
and writes JSON (``--out``).

    python -m benchmarks.backlog --rows 1000000 --transactions 200000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.apply_bench import LOAD
from benchmarks.harness import (
    TABLE,
    NativeRun,
    PgsubRun,
    daemon_session,
    discard,
    discard_cluster,
    long_load_publisher,
    stop_on_sigterm,
    wait_for,
    write_results,
    writer_processes,
)
from benchmarks.memory import WriterMemory, jvm_peak_rss_mb, jvm_text
from subscriber.replication.catalog import wal_end
from subscriber.replication.lsn import Lsn
from subscriber.replication.stream import ReplicationConnection
from subscriber.runtime.daemon import tune_garbage_collector
from subscriber.runtime.embedded import PgCluster, bin_dir

CLIENTS = 4


@dataclass
class Figures:
    subscriber: str
    transactions: int = 0
    drain_seconds: float = 0.0
    transactions_per_s: float = 0.0
    peak_rss_python_mb: float | None = None
    peak_rss_jvm_mb: float | None = None


def backlog(publisher: PgCluster, table: str, args: argparse.Namespace) -> Lsn:
    """pgbench's single-row updates of ``table`` as fast as they go; the WAL position after."""
    script = Path(tempfile.mkdtemp()) / "update.sql"
    script.write_text(
        f"\\set id random(1, {args.rows})\n"
        f"UPDATE {table} SET n = n + 1, ts = now() WHERE id = :id;\n"
    )
    os.chmod(script.parent, 0o755)  # noqa: S103 - pgbench may run as the server user
    os.chmod(script, 0o644)
    pgbench = [
        str(bin_dir(15) / "pgbench"),
        "-n", "-c", str(CLIENTS), "-j", "2", "-t", str(args.transactions // CLIENTS),
        "-f", str(script), "-h", "127.0.0.1", "-p", str(publisher.port), "-U", "postgres",
        "bench",
    ]  # fmt: skip
    subprocess.run(pgbench, check=True, capture_output=True)  # noqa: S603
    with publisher.connect("bench") as conn:
        return wal_end(conn)


def restart_after(publisher: PgCluster, slot: str, lsn: Lsn, timeout: float = 120) -> None:
    """Until ``slot``'s restart point is past ``lsn``, as any slot's is within seconds of a
    subscriber confirming it while the publisher writes.

    A slot's restart point moves only at a snapshot of the running transactions in the
    WAL (every 15 s, at a checkpoint) confirmed after it; a first run of a few seconds
    sees none, and the second run's walsender would decode the N rows again, about 180 MB
    of WAL, before the backlog - work PostgreSQL's slot, made after them, never does."""
    with publisher.connect("bench") as conn:
        conn.execute("CHECKPOINT")  # writes that snapshot
        started = time.monotonic()
        while True:
            row = conn.execute(
                "SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row is not None and row[0] is not None and Lsn.parse(str(row[0])) >= lsn:
                return
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"slot {slot!r}'s restart point not past {lsn} in {timeout}s")
            time.sleep(0.1)


def run_native(publisher: PgCluster, args: argparse.Namespace) -> Figures:
    figures = Figures("PostgreSQL 15 subscriber", args.transactions // CLIENTS * CLIENTS)
    with NativeRun(publisher, "bench_native") as native:
        subscriber = native.subscriber
        with subscriber.connect("bench") as conn:
            conn.execute("ALTER SUBSCRIPTION native DISABLE")
        target = backlog(publisher, "bench_native", args)
        started = time.monotonic()
        with subscriber.connect("bench") as conn:
            conn.execute("ALTER SUBSCRIPTION native ENABLE")
        figures.drain_seconds = wait_for(native.position, target, since=started)
    figures.transactions_per_s = figures.transactions / figures.drain_seconds
    return figures


def run_pgsub(publisher: PgCluster, args: argparse.Namespace, spark: Any) -> Figures:
    figures = Figures("pgsub", args.transactions // CLIENTS * CLIENTS)
    warehouse = Path(tempfile.mkdtemp(prefix="pgsub-bench-wh-"))
    settings: dict[str, Any] = {
        "connection": publisher.dsn("bench"),
        "publications": ["pub_bench_pgsub"],
        "batch": {"max_changes": args.max_changes, "max_delay": args.max_delay},
    }
    settings["writer_processes"] = args.writer_processes
    try:
        with publisher.connect("bench") as pub:
            loaded = wal_end(pub)
        with PgsubRun(spark, warehouse=warehouse, **settings) as first:
            first.start()
            wait_for(first.position, loaded)  # the N rows, one streamed INSERT; then it stops
            restart_after(publisher, "bench", loaded)
        target = backlog(publisher, "bench_pgsub", args)
        with (
            PgsubRun(spark, warehouse=warehouse, **settings) as run,
            WriterMemory(run.runner.tables) as memory,
        ):
            started = time.monotonic()
            run.start()
            figures.drain_seconds = wait_for(run.position, target, since=started)
            figures.peak_rss_python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            # The daemon's Python is its writer processes too (their PSS together).
            figures.peak_rss_python_mb += memory.peak_mb
            figures.peak_rss_jvm_mb = jvm_peak_rss_mb()
    finally:
        discard(warehouse)
    figures.transactions_per_s = figures.transactions / figures.drain_seconds
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--transactions", type=int, default=200_000)
    parser.add_argument("--max-changes", type=int, default=100_000)
    parser.add_argument("--max-delay", type=float, default=1.0)
    parser.add_argument(
        "--writer-processes",
        type=writer_processes,
        default="auto",
        help="pgsub's writer_processes: auto (the default), 0 (threads) or a number",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/backlog.json"))
    args = parser.parse_args()
    stop_on_sigterm()
    publisher = long_load_publisher()
    try:
        with publisher.connect("bench") as conn:
            for name in ("bench_native", "bench_pgsub"):
                conn.execute(TABLE.format(name=name))
                conn.execute(f"CREATE PUBLICATION pub_{name} FOR TABLE {name}")
            conn.execute(LOAD.format(name="bench_native", rows=args.rows))
        with ReplicationConnection(publisher.dsn("bench")) as replication:
            replication.create_slot("bench")
        with publisher.connect("bench") as conn:
            conn.execute(LOAD.format(name="bench_pgsub", rows=args.rows))
            conn.execute("VACUUM ANALYZE")
        # pgsub first: PostgreSQL's subscriber's slot, made after, decodes none of its WAL.
        spark = daemon_session()  # its JVM, if the drain needs one, in the figure
        tune_garbage_collector()  # as `pgsub run` does
        ours = run_pgsub(publisher, args, spark)
        print(json.dumps(asdict(ours), indent=2), flush=True)
        native = run_native(publisher, args)
        print(json.dumps(asdict(native), indent=2), flush=True)
    finally:
        discard_cluster(publisher)
    write_results(args, ours, native)
    print(f"rows={args.rows:,} backlog={ours.transactions:,} single-row UPDATEs")
    print("| figure | pgsub | PostgreSQL 15 subscriber | pgsub / PostgreSQL |")
    print("|---|---|---|---|")
    print(
        f"| seconds to drain | {ours.drain_seconds:.2f} | {native.drain_seconds:.2f} |"
        f" {native.drain_seconds / ours.drain_seconds:.2f}x |"
    )
    print(
        f"| transactions/s | {ours.transactions_per_s:,.0f} | {native.transactions_per_s:,.0f} |"
        f" {ours.transactions_per_s / native.transactions_per_s:.2f}x |"
    )
    python, jvm = ours.peak_rss_python_mb or 0, jvm_text(ours.peak_rss_jvm_mb)
    print(f"| peak RSS python / JVM (MB) | {python:.0f} / {jvm} | - | |")


if __name__ == "__main__":
    main()
