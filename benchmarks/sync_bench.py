"""Initial-sync benchmark: pgsub beside PostgreSQL's own subscriber and the raw COPY read.

One N-row table (bigint key, int, text, timestamptz, numeric), default
2,000,000 rows, synchronized to READY:

- raw limit: ``COPY (SELECT ...) TO STDOUT WITH (FORMAT csv)`` read by
  psycopg, rows/s;
- PostgreSQL 15 subscriber: ``CREATE SUBSCRIPTION`` into a second cluster,
  seconds until the table is READY ('r');
- pgsub: a subscription with ``copy_data: true`` in this process (local
  Spark, local Delta), seconds until READY, and the peak memory of this
  Python process and of its Spark driver JVM.

Run it at two sizes (``--rows 2000000`` and ``--rows 10000000``) to see
whether memory depends on table size. Prints one table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

from apply.delta.session import SparkSettings, build_session
from benchmarks.harness import PgsubRun, jvm_peak_rss_mb
from subscriber.runtime.daemon import tune_garbage_collector
from subscriber.runtime.embedded import PgCluster
from tablesync.state import TableState

TABLE = """
CREATE TABLE bench (
    id bigint PRIMARY KEY, n int NOT NULL, t text, ts timestamptz, amount numeric(12, 2)
)
"""
LOAD = (
    "INSERT INTO bench SELECT g, g % 1000, md5(g::text), now() - g * interval '1 second',"
    " g / 100.0 FROM generate_series(1, {rows}) g"
)


def raw_copy(publisher: PgCluster) -> float:
    """Rows per second of a bare COPY read."""
    started = time.monotonic()
    rows = 0
    query = "COPY (SELECT * FROM bench) TO STDOUT WITH (FORMAT csv)"
    with publisher.connect("bench") as conn, conn.cursor() as cursor, cursor.copy(query) as copy:
        for _ in copy:
            rows += 1
    return rows / (time.monotonic() - started)


def native(publisher: PgCluster, rows: int) -> float:
    subscriber = PgCluster(major=15).start()
    try:
        with subscriber.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with subscriber.connect("bench") as conn:
            conn.execute(TABLE)
            started = time.monotonic()
            conn.execute(
                f"CREATE SUBSCRIPTION native CONNECTION '{publisher.dsn('bench')}' PUBLICATION pub"
            )
            while conn.execute(
                "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
            ).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.05)
            seconds = time.monotonic() - started
            conn.execute("ALTER SUBSCRIPTION native DISABLE")
            conn.execute("ALTER SUBSCRIPTION native SET (slot_name = NONE)")
            conn.execute("DROP SUBSCRIPTION native")
        with publisher.connect("bench") as pub:
            pub.execute("SELECT pg_drop_replication_slot('native')")
    finally:
        subscriber.destroy()
    return rows / seconds


def pgsub(publisher: PgCluster, rows: int, spark: Any) -> dict[str, float | None]:
    from structlog.testing import capture_logs

    run = PgsubRun(spark, connection=publisher.dsn("bench"), publications=["pub"], copy_data=True)
    with run, capture_logs() as events:
        started = time.monotonic()
        run.start()
        while True:
            statuses = run.runner.coordinator.statuses
            if statuses and all(s.state is TableState.READY for s in statuses):
                break
            time.sleep(0.05)
        seconds = time.monotonic() - started
        copy = next((e.get("seconds") for e in events if e["event"] == "table copy finished"), None)
        return {
            "rows_per_s": rows / seconds,
            "seconds": seconds,
            "copy_seconds": copy,  # COPY read, parse and the Delta write, in the sync worker
            "peak_rss_python_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_rss_jvm_mb": jvm_peak_rss_mb(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/sync.json"))
    parser.add_argument("--skip-native", action="store_true")
    args = parser.parse_args()
    publisher = PgCluster(major=15, settings={"max_wal_size": "4GB"}).start()
    try:
        with publisher.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with publisher.connect("bench") as conn:
            conn.execute(TABLE)
            conn.execute(LOAD.format(rows=args.rows))
            conn.execute("VACUUM ANALYZE bench")
            conn.execute("CREATE PUBLICATION pub FOR TABLE bench")
        raw = raw_copy(publisher)
        theirs = None if args.skip_native else native(publisher, args.rows)
        spark = build_session(SparkSettings(master="local[*]"))
        tune_garbage_collector()  # as `pgsub run` does
        ours = pgsub(publisher, args.rows, spark)
    finally:
        publisher.destroy()
    figures = {
        "rows": args.rows,
        "raw_copy_rows_per_s": raw,
        "native_rows_per_s": theirs,
        "pgsub": ours,
    }
    print(json.dumps(figures, indent=2))
    mine = ours["rows_per_s"] or 0
    print(
        f"\n| initial sync, {args.rows:,} rows | pgsub | PostgreSQL 15 subscriber | raw COPY read |"
    )
    print("|---|---|---|---|")
    print(f"| rows/s to READY | {mine:,.0f} | {theirs or 0:,.0f} | {raw:,.0f} |")
    if theirs:
        print(f"| pgsub / PostgreSQL | {mine / theirs:.2f}x | | pgsub / raw {mine / raw:.2f}x |")
    memory = f"{ours['peak_rss_python_mb'] or 0:.0f} / {ours['peak_rss_jvm_mb'] or 0:.0f}"
    print(f"| peak RSS python / JVM (MB) | {memory} | | |")
    phases = f"copy {ours['copy_seconds'] or 0:.1f} s of {ours['seconds']:.1f} s to READY"
    print(f"| pgsub: {phases} | | | |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
