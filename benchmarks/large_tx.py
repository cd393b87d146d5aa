"""Large-transaction benchmark: one N-row INSERT with ``streaming = on``, pgsub beside PostgreSQL.

One transaction inserts N rows (default 5,000,000) into an empty table of
the apply benchmark's shape (bigint key, int, text, timestamptz, numeric).
The publisher streams it while it runs (it passes ``logical_decoding_work_mem``);
each subscriber spools it and applies it at commit. Figures, for each:

- rows/s from the publisher's COMMIT until the subscriber has it durably
  applied (the whole transaction over those seconds);
- peak RSS: pgsub's Python process and its Spark driver JVM (VmHWM), and
  PostgreSQL's apply worker process (VmHWM, read from /proc while it runs).

The native subscriber is a second PostgreSQL 15 cluster (``CREATE
SUBSCRIPTION ... WITH (streaming = on)``); pgsub runs in this process with
local Spark and a local Delta warehouse. Run it at two sizes, each in its
own process, to see whether memory is flat in transaction size. Nothing here
is a test: it prints its figures and writes JSON (``--out``).

    python -m benchmarks.large_tx --rows 5000000
"""

from __future__ import annotations

import argparse
import json
import resource
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    TABLE,
    PgsubRun,
    daemon_session,
    discard_cluster,
    lsn_of,
    stop_on_sigterm,
    wait_for,
)
from benchmarks.memory import jvm_peak_rss_mb, jvm_text, vm_hwm_mb
from subscriber.replication.catalog import wal_end
from subscriber.replication.stream import ReplicationConnection
from subscriber.runtime.daemon import tune_garbage_collector
from subscriber.runtime.embedded import PgCluster

INSERT = (
    "INSERT INTO {name} SELECT g, 0, md5(g::text), now(), g / 100.0"
    " FROM generate_series(1, {rows}) g"
)


@dataclass
class Figures:
    subscriber: str
    rows: int
    insert_seconds: float = 0.0  # the publisher's INSERT ... COMMIT
    applied_seconds: float = 0.0  # COMMIT -> durably applied
    rows_per_s: float = 0.0
    peak_rss_mb: float | None = None  # PostgreSQL's apply worker, or pgsub's Python process
    peak_rss_jvm_mb: float | None = None
    peak_spill_mb: float | None = None


def insert(publisher: PgCluster, name: str, rows: int) -> tuple[float, Any]:
    """Run the N-row transaction; (seconds it took, LSN after its commit)."""
    with publisher.connect("bench") as pub:
        started = time.monotonic()
        pub.execute(INSERT.format(name=name, rows=rows))
        seconds = time.monotonic() - started
        return seconds, wal_end(pub)


def run_native(publisher: PgCluster, rows: int) -> Figures:
    figures = Figures("PostgreSQL 15 subscriber", rows)
    subscriber = PgCluster(major=15).start()
    try:
        with subscriber.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with subscriber.connect("bench") as conn:
            conn.execute(TABLE.format(name="big_native"))
            conn.execute(
                f"CREATE SUBSCRIPTION native CONNECTION '{publisher.dsn('bench')}'"
                " PUBLICATION pub_native WITH (streaming = on, copy_data = false)"
            )
            pid: int | None = None
            while pid is None:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_subscription WHERE relid IS NULL AND pid IS NOT NULL"
                ).fetchone()
                pid = int(str(row[0])) if row else None
                time.sleep(0.1)
            peak = [0.0]
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], vm_hwm_mb(pid) or 0.0)
                    time.sleep(0.2)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()

            def applied() -> Any:
                return lsn_of(
                    conn,
                    "SELECT remote_lsn FROM pg_replication_origin_status s"
                    " JOIN pg_subscription p ON s.external_id = 'pg_' || p.oid",
                )

            figures.insert_seconds, target = insert(publisher, "big_native", rows)
            figures.applied_seconds = wait_for(applied, target)
            done.set()
            watcher.join()
            figures.rows_per_s = rows / figures.applied_seconds
            figures.peak_rss_mb = peak[0] or None
            conn.execute("ALTER SUBSCRIPTION native DISABLE")
    finally:
        discard_cluster(subscriber)
    return figures


def run_pgsub(publisher: PgCluster, rows: int, max_changes: int) -> Figures:
    figures = Figures("pgsub", rows)
    # Made now, so that its decoding starts after the native subscriber's transaction.
    with ReplicationConnection(publisher.dsn("bench")) as replication:
        replication.create_slot("bench")
    spark = daemon_session()
    tune_garbage_collector()  # as `pgsub run` does
    spilled = [0.0]
    done = threading.Event()
    with PgsubRun(
        spark,
        connection=publisher.dsn("bench"),
        publications=["pub_pgsub"],
        streaming="on",
        batch={"max_changes": max_changes, "max_delay": 1.0},
    ) as run:

        def watch() -> None:
            gauge = run.metrics.spill_bytes.labels("bench")
            while not done.is_set():
                spilled[0] = max(spilled[0], gauge._value.get() / 2**20)
                time.sleep(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        try:
            run.start()
            while not run.runner.ready:
                time.sleep(0.1)
            watcher.start()
            figures.insert_seconds, target = insert(publisher, "big_pgsub", rows)
            figures.applied_seconds = wait_for(run.position, target)
            figures.rows_per_s = rows / figures.applied_seconds
            figures.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            figures.peak_rss_jvm_mb = jvm_peak_rss_mb()
            figures.peak_spill_mb = spilled[0]
        finally:
            done.set()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--max-changes", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/large-tx.json"))
    args = parser.parse_args()
    stop_on_sigterm()

    publisher = PgCluster(
        major=15, settings={"max_wal_size": "8GB", "checkpoint_timeout": "30min"}
    ).start()
    try:
        with publisher.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with publisher.connect("bench") as conn:
            conn.execute(TABLE.format(name="big_native"))
            conn.execute(TABLE.format(name="big_pgsub"))
            conn.execute("CREATE PUBLICATION pub_native FOR TABLE big_native")
            conn.execute("CREATE PUBLICATION pub_pgsub FOR TABLE big_pgsub")
        native = run_native(publisher, args.rows)
        print(json.dumps(asdict(native), indent=2), flush=True)
        ours = run_pgsub(publisher, args.rows, args.max_changes)
        print(json.dumps(asdict(ours), indent=2), flush=True)
    finally:
        discard_cluster(publisher)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"rows": args.rows, "pgsub": asdict(ours), "native": asdict(native)}, indent=2)
    )
    ratio = ours.rows_per_s / native.rows_per_s if native.rows_per_s else 0
    print(
        f"\n{args.rows:,}-row streamed transaction: pgsub {ours.rows_per_s:,.0f} rows/s,"
        f" PostgreSQL {native.rows_per_s:,.0f} rows/s ({ratio:.2f}x); peak RSS pgsub Python"
        f" {ours.peak_rss_mb or 0:,.0f} MB / JVM (MB) {jvm_text(ours.peak_rss_jvm_mb)},"
        f" PostgreSQL apply worker {native.peak_rss_mb or 0:,.0f} MB;"
        f" spooled {ours.peak_spill_mb or 0:,.0f} MB"
    )


if __name__ == "__main__":
    main()
