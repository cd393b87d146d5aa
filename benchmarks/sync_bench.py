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
whether memory depends on table size. ``--ranges 1,2,4`` runs pgsub once
per number of CTID ranges (``copy.ranges``); ``--master spark://...`` runs
it on a cluster, ``--master standalone`` on a two-worker standalone cluster
started here; ``--remote sc://...`` through a Spark Connect server,
``--remote local`` through one started here (local[2]; its JVM is not in
the memory figures). ``--warehouse-in disk,s3`` runs it with the warehouse
on this machine's disk and in a bucket of versitygw (a real S3 gateway on
127.0.0.1), one after the other. Prints one table, writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import tempfile
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from apply.delta.spark.session import SparkSettings, build_session, stop_sessions
from benchmarks.harness import BenchWarehouse, PgsubRun, discard, discard_cluster, stop_on_sigterm
from benchmarks.memory import jvm_peak_rss_mb
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
        discard_cluster(subscriber)
    return rows / seconds


# The events whose times make the timeline of a sync.
MILESTONES: tuple[str, ...] = ("table state changed", "target table created", "table copy started")
MILESTONES += ("table copy finished", "table synchronized")


@contextlib.contextmanager
def timed_events() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every log event, with ``at`` (monotonic seconds) added."""
    import structlog
    from structlog.testing import LogCapture

    capture = LogCapture()
    processors = structlog.get_config()["processors"]

    def stamp(logger: Any, name: str, event: MutableMapping[str, Any]) -> Any:
        event["at"] = time.monotonic()
        return event

    structlog.configure(processors=[stamp, capture])
    try:
        yield capture.entries
    finally:
        structlog.configure(processors=processors)


def pgsub(
    publisher: PgCluster,
    rows: int,
    spark: Any,
    ranges: int | None,
    readers: int,
    warehouse: BenchWarehouse,
    sees_warehouse: bool | None = None,
) -> dict[str, Any]:
    """One sync to READY; on a local disk into a warehouse of its own (a folder a run)."""
    copy = {"ranges": ranges or "auto", "readers": readers}
    run = PgsubRun(
        spark,
        warehouse=warehouse if warehouse.kind != "disk" else None,
        name=f"bench_{warehouse.kind}_{ranges or 'auto'}",
        sees_warehouse=sees_warehouse,
        connection=publisher.dsn("bench"),
        publications=["pub"],
        copy_data=True,
        copy=copy,
    )
    with run, timed_events() as events:
        started = time.monotonic()
        run.start()
        while True:
            statuses = run.runner.coordinator.statuses
            if statuses and all(s.state is TableState.READY for s in statuses):
                break
            time.sleep(0.05)
        seconds = time.monotonic() - started
        copied = next((e["seconds"] for e in events if e["event"] == "table copy finished"), None)
        started_copy = next((e for e in events if e["event"] == "table copy started"), {})
        timeline = [
            [round(e["at"] - started, 2), e["event"], e.get("state", "")]
            for e in events
            if e["event"] in MILESTONES
        ]
        return {
            "warehouse": warehouse.kind,
            "timeline": timeline,
            "readers": readers,
            "ranges": started_copy.get("ranges"),
            "read_by": started_copy.get("read_by"),
            "rows_per_s": rows / seconds,
            "seconds": seconds,
            "copy_seconds": copied,  # COPY read, parse and the Delta write, in the sync worker
            "peak_rss_python_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_rss_jvm_mb": jvm_peak_rss_mb(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/sync.json"))
    parser.add_argument("--skip-native", action="store_true")
    parser.add_argument(
        "--ranges", default="auto", help="comma-separated CTID range counts, or auto"
    )
    parser.add_argument(
        "--readers", type=int, help="copy.readers (default: 2 for a number of ranges, else 1)"
    )
    parser.add_argument(
        "--master", default="local[*]", help="pgsub's Spark master; standalone: start one here"
    )
    parser.add_argument(
        "--warehouse-in",
        default="disk",
        help="disk, s3 (a bucket of versitygw, a real S3 gateway), or disk,s3: both in one run",
    )
    parser.add_argument(
        "--remote", help="a Spark Connect server's sc:// URL instead; local: start one here"
    )
    parser.add_argument(
        "--sees-warehouse",
        choices=("auto", "true", "false"),
        default="auto",
        help="spark.sees_warehouse: false reads and writes the copy by Spark tasks on a cluster",
    )
    args = parser.parse_args()
    sees = None if args.sees_warehouse == "auto" else args.sees_warehouse == "true"
    stop_on_sigterm()
    counts = [None if r == "auto" else int(r) for r in args.ranges.split(",")]
    if "s3" in args.warehouse_in and len(counts) > 1:
        parser.error("--warehouse-in s3 takes one --ranges value (the bucket holds one table)")
    publisher = PgCluster(major=15, settings={"max_wal_size": "4GB"}).start()
    with contextlib.ExitStack() as stack:
        stack.callback(discard_cluster, publisher)
        with publisher.connect() as conn:
            conn.execute("CREATE DATABASE bench")
        with publisher.connect("bench") as conn:
            conn.execute(TABLE)
            conn.execute(LOAD.format(rows=args.rows))
            conn.execute("VACUUM ANALYZE bench")
            conn.execute("CREATE PUBLICATION pub FOR TABLE bench")
        raw = raw_copy(publisher)
        theirs = None if args.skip_native else native(publisher, args.rows)
        master, remote = args.master, args.remote
        root = Path(tempfile.mkdtemp(prefix="pgsub-bench-"))
        stack.callback(discard, root)
        if master == "standalone":
            from tests.support.spark_cluster import standalone_cluster

            master = stack.enter_context(standalone_cluster(root, workers=2)).url
        if remote == "local":
            from tests.support.spark_connect import connect_server

            remote = stack.enter_context(connect_server(root)).url
        warehouses = [BenchWarehouse(kind) for kind in args.warehouse_in.split(",")]
        for warehouse in warehouses:
            stack.callback(warehouse.close)
        conf = next((w.spark_conf for w in warehouses if w.spark_conf), {})
        spark = build_session(SparkSettings(master=master, remote=remote, conf=conf))
        stack.callback(stop_sessions if remote else spark.stop)
        tune_garbage_collector()  # as `pgsub run` does
        # One reader for one range and for auto (the daemon's default), two for a number.
        ours = [
            pgsub(
                publisher,
                args.rows,
                spark,
                count,
                args.readers or (2 if (count or 1) > 1 else 1),
                warehouse,
                sees,
            )
            for warehouse in warehouses
            for count in counts
        ]
    figures = {
        "rows": args.rows,
        "master": args.master,
        "remote": args.remote,
        "raw_copy_rows_per_s": raw,
        "native_rows_per_s": theirs,
        "pgsub": ours,
    }
    print(json.dumps(figures, indent=2))
    report(args, figures)


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    ours, theirs, raw = (
        figures["pgsub"],
        figures["native_rows_per_s"],
        figures["raw_copy_rows_per_s"],
    )
    print(
        f"\n| initial sync, {args.rows:,} rows, {args.remote or args.master} | rows/s to READY"
        " | copy / to READY (s) | peak RSS Python / JVM (MB) |"
    )
    print("|---|---|---|---|")
    for run in ours:
        mine = run["rows_per_s"] or 0
        ratio = f" ({mine / theirs:.2f}x)" if theirs else ""
        by = f"{run['readers']} reader(s)" if run["read_by"] == "pgsub" else run["read_by"]
        label = f"pgsub ({run['warehouse']}), {run['ranges']} range(s) read by {by}"
        seconds = f"{run['copy_seconds'] or 0:.1f} / {run['seconds'] or 0:.1f}"
        memory = f"{run['peak_rss_python_mb'] or 0:.0f} / {run['peak_rss_jvm_mb'] or 0:.0f}"
        print(f"| {label} | {mine:,.0f}{ratio} | {seconds} | {memory} |")
    print(f"| PostgreSQL 15 subscriber | {theirs or 0:,.0f} | | |")
    print(f"| raw COPY read | {raw:,.0f} | | |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
