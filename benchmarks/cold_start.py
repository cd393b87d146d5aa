"""A cold start: ``pgsub run`` as a user starts it, beside PostgreSQL's own subscriber.

The other benchmarks start their clock once pgsub's Spark session is up in
their own process; a user's clock starts when they type ``pgsub run``. Here
the clock starts before the process: N small tables (default 200 x 2,000
rows, as ``make bench-tables``) in a publication, ``pgsub run -c`` a fresh
config (a new warehouse, its own slot), and the seconds until its
``/status`` shows every table READY - copied, caught up and handed to the
leader. PostgreSQL's subscriber: the seconds from ``CREATE SUBSCRIPTION``
until every ``pg_subscription_rel`` row is ``r`` (its server already runs,
as a subscriber's does). Also: when pgsub's endpoint first answered, when
its first table was READY, its peak memory (Python and the JVM, if one was
started). Nothing here is a test: it prints a table and writes JSON.
``--by-workers``: the slot is made before pgsub starts, so that a worker syncs
every table (PostgreSQL's path, which its subscriber takes too) instead of
the first start's load under the new slot's snapshot.

    python -m benchmarks.cold_start --tables 200 --rows 2000 [--by-workers]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import (
    discard,
    discard_cluster,
    stop_on_sigterm,
    write_results,
    writer_processes,
)
from benchmarks.memory import children, command, pss_mb, vm_hwm_mb
from benchmarks.tables_bench import publisher_with_tables, run_native
from subscriber.runtime.embedded import PgCluster


@dataclass
class ColdStart:
    subscriber: str
    ready_seconds: float | None = None  # to every table READY
    endpoint_seconds: float | None = None  # to the HTTP endpoint's first answer
    first_table_seconds: float | None = None  # to the first table READY
    peak_rss_python_mb: float | None = None  # the daemon's, and its writer processes' (PSS)
    peak_rss_jvm_mb: float | None = None  # None: no JVM was started
    writer_processes_mb: float | None = None  # their server's and theirs, PSS; None: none ran
    notes: list[str] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as reply:
            return json.loads(reply.read())  # type: ignore[no-any-return]
    except OSError:
        return None


def _sample_children(pid: int, figures: ColdStart) -> None:
    """The peaks of the daemon's JVM (its RSS) and of its writer processes' server and theirs
    (their PSS together), so far."""
    writers: set[int] = set()
    for child in children(pid):
        if b"java" in command(child):
            jvm = vm_hwm_mb(child) or 0.0
            figures.peak_rss_jvm_mb = max(figures.peak_rss_jvm_mb or 0.0, jvm) or None
        else:
            writers |= {child, *children(child)}
    if writers:
        figures.writer_processes_mb = max(figures.writer_processes_mb or 0.0, pss_mb(writers))


def _make_slot(publisher: PgCluster, name: str) -> None:
    """A slot made before pgsub's start: it resumes there, as after a restart in the middle
    of its first sync, and syncs every table with a worker of its own - the path of tables
    added by ``pgsub refresh`` or ``pgsub resync``."""
    with publisher.connect("bench") as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))


def run_pgsub(publisher: PgCluster, args: argparse.Namespace, start: str, run: int) -> ColdStart:
    """One cold ``pgsub run`` with ``spark.start: start``, its own subscription and slot: a
    slot of an earlier run would make it resume there and sync each table by a worker of its
    own instead of loading them all under its new slot's snapshot, as a first start does."""
    figures = ColdStart(f"pgsub run, spark.start {start}")
    name = f"cold_{run}_{start}"
    if args.by_workers:
        _make_slot(publisher, name)
        figures.notes.append("every table synced by a worker (its slot made before the start)")
    folder = Path(tempfile.mkdtemp(prefix="pgsub-bench-cold-"))
    port = _free_port()
    config = {
        "warehouse": str(folder / "warehouse"),
        "spark": {"master": "local[*]", "start": start},
        "metrics": {"host": "127.0.0.1", "port": port},
        "log": {"format": "json", "level": "info"},
        "subscriptions": [
            {
                "name": name,
                "connection": publisher.dsn("bench"),
                "publications": ["pub_ours"],
                "copy_data": True,
                "max_sync_workers": args.sync_workers,
                "spool_dir": str(folder / "spool"),
                "writer_processes": args.writer_processes,
            }
        ],
    }
    path = folder / "pgsub.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (folder / "pgsub.log").open("w")
    started = time.monotonic()
    process = subprocess.Popen(  # noqa: S603 - this interpreter, this repository's CLI
        [sys.executable, "-m", "subscriber.runtime.cli", "run", "-c", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the JVM goes with it
    )
    try:
        while time.monotonic() - started < args.timeout:
            if process.poll() is not None:
                raise SystemExit(f"pgsub exited with {process.returncode}: see {log.name}")
            _sample_children(process.pid, figures)
            status = _status(port)
            now = time.monotonic() - started
            if status is None:
                time.sleep(0.05)
                continue
            figures.endpoint_seconds = figures.endpoint_seconds or now
            tables = [t for s in status["subscriptions"] for t in s["tables"]]
            ready = [t for t in tables if t["state"] == "ready"]
            if ready and figures.first_table_seconds is None:
                figures.first_table_seconds = now
            if len(tables) >= args.tables and len(ready) == len(tables):
                figures.ready_seconds = now
                break
            time.sleep(0.05)
        daemon = vm_hwm_mb(process.pid)
        figures.peak_rss_python_mb = daemon and daemon + (figures.writer_processes_mb or 0)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()
        # The daemon has ended: its tables go, its log (named below) stays to be read.
        for made in ("warehouse", "spool"):
            discard(folder / made)
    figures.notes.append(f"max_sync_workers {args.sync_workers}; log: {log.name}")
    figures.notes.append(f"writer_processes: {args.writer_processes}")
    if figures.peak_rss_jvm_mb is None:
        figures.notes.append("no JVM was started")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows", type=int, default=2000, help="rows per table")
    parser.add_argument("--sync-workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for READY")
    parser.add_argument(
        "--spark-start",
        default="on_demand,at_start",
        help="spark.start of each pgsub run, in turn (comma-separated)",
    )
    parser.add_argument(
        "--writer-processes",
        type=writer_processes,
        default="auto",
        help="pgsub's writer_processes: auto (the default), 0 (threads) or a number",
    )
    parser.add_argument(
        "--by-workers",
        action="store_true",
        help="make each run's slot before it starts, so that a worker syncs every table"
        " (tables added later, a restart mid-sync) instead of the first start's load",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/cold_start.json"))
    args = parser.parse_args()
    args.seconds = 0  # run_native: the sync alone
    stop_on_sigterm()
    publisher = publisher_with_tables(args)
    try:
        native = run_native(publisher, args)
        starts = args.spark_start.split(",")
        runs = [run_pgsub(publisher, args, start, n) for n, start in enumerate(starts, 1)]
    finally:
        discard_cluster(publisher)
    for ours in runs:
        print(json.dumps(asdict(ours), indent=2), flush=True)
    print(f"\n{args.tables} tables x {args.rows} rows, from the start to every table READY")
    print(f"{'':30}" + "".join(f"{r.subscriber[-9:]:>12}" for r in runs) + f"{'PostgreSQL':>12}")
    rows = [
        ("to every table READY (s)", [r.ready_seconds for r in runs], native.sync_seconds),
        ("HTTP endpoint answers (s)", [r.endpoint_seconds for r in runs], None),
        ("first table READY (s)", [r.first_table_seconds for r in runs], None),
        ("peak RSS Python (MB)", [r.peak_rss_python_mb for r in runs], None),
        ("peak RSS JVM (MB)", [r.peak_rss_jvm_mb for r in runs], None),
    ]
    for label, values, theirs in rows:
        cells = "".join(f"{v:>12.1f}" if v is not None else f"{'-':>12}" for v in values)
        print(f"{label:30}{cells}" + (f"{theirs:>12.1f}" if theirs is not None else ""))
    ratios = ", ".join(
        f"{r.subscriber}: {native.sync_seconds / r.ready_seconds:.2f}x"
        for r in runs
        if r.ready_seconds
    )
    print(f"PostgreSQL's time / pgsub's: {ratios}")
    write_results(args, runs[0], native)


if __name__ == "__main__":
    main()
