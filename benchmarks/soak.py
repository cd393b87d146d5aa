"""Soak benchmark: a steady load for many minutes, pgsub beside PostgreSQL's subscriber.

A 1M-row table (``--rows``), copied by each subscriber, then pgbench
single-row updates at ``--rate`` per second for ``--minutes``. Lag is
sampled every 100 ms (``benchmarks.harness.steady_load``) and reported per
window (``--window`` minutes): p50 / p99 / max, so a lag that grows with
time shows. pgsub runs with its maintenance thread (compaction every
``--maintenance-interval``), and the target table's data file count, its
Delta log and ``_pgsub/`` sizes are reported at the start and the end,
and the warehouse's size and the disk's free space every minute: a table
updated at random is rewritten at every MERGE, and the replaced files stay
for ``maintenance.retention`` (docs/operations.md). A run that fails keeps
what it measured so far in ``--out`` (``"failed": true``).

    python -m benchmarks.soak --minutes 60 --rate 3000
    python -m benchmarks.soak --minutes 60 --rate 3000 --deletion-vectors always --retention-hours 1
    python -m benchmarks.soak --rows 10000000 --minutes 10 --window 2   # make bench-bigtable
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from apply.delta.spark.session import SparkSettings, build_session
from benchmarks.harness import (
    BenchWarehouse,
    NativeRun,
    PgsubRun,
    bench_publisher,
    discard_cluster,
    folder_bytes,
    percentile,
    steady_load,
    stop_on_sigterm,
)
from benchmarks.memory import peak_rss
from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.daemon import tune_garbage_collector

SAMPLES_PER_SECOND = 10  # steady_load samples every 100 ms


def windows(lags: list[float], minutes: float) -> list[dict[str, float]]:
    size = max(1, int(minutes * 60 * SAMPLES_PER_SECOND))
    return [
        {
            "p50": percentile(part, 0.5),
            "p99": percentile(part, 0.99),
            "max": max(part),
        }
        for part in (lags[i : i + size] for i in range(0, len(lags), size))
        if part
    ]


def table_health(spark: Any, run: PgsubRun, table: str) -> dict[str, Any]:
    """The table's files, its log's and the state's bytes (read where the warehouse's bytes
    are on this machine: a folder, or the bucket's folder under the gateway)."""
    path = run.warehouse / "public" / table
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{run.location}/public/{table}`").first()
    return {
        "data_files": int(detail["numFiles"]),
        "table_bytes": int(detail["sizeInBytes"]),
        "deletion_vectors": (detail["properties"] or {}).get("delta.enableDeletionVectors")
        == "true",
        "delta_log_bytes": folder_bytes(path / "_delta_log"),
        "pgsub_state_bytes": folder_bytes(run.warehouse / "_pgsub"),
    }


def merge_writes(spark: Any, location: str, table: str) -> dict[str, Any]:
    """What each MERGE of the run wrote and replaced (bytes, files), from the table's
    history: a write that follows the batch, not the table, shows here."""
    path = f"{location}/public/{table}"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    merges = [r["operationMetrics"] or {} for r in history if r["operation"] == "MERGE"]

    def figures(name: str) -> dict[str, float]:
        values = [float(m.get(name) or 0) for m in merges]
        if not values:
            return {}
        return {"p50": percentile(values, 0.5), "max": max(values)}

    compactions = [r for r in history if r["operation"] == "OPTIMIZE"]
    return {
        "merges": len(merges),
        "rows_updated": figures("numTargetRowsUpdated"),
        "bytes_added": figures("numTargetBytesAdded"),
        "bytes_removed": figures("numTargetBytesRemoved"),
        "files_removed": figures("numTargetFilesRemoved"),
        "deletion_vectors_added": figures("numTargetDeletionVectorsAdded"),
        "compactions": len(compactions),
        "compaction_bytes_added": sum(
            float((r["operationMetrics"] or {}).get("numAddedBytes") or 0) for r in compactions
        ),
    }


class DiskWatch:
    """The warehouse's size and the disk's free space, once per ``every`` seconds."""

    def __init__(self, warehouse: Path, every: float = 60.0) -> None:
        self.warehouse = warehouse
        self.every = every
        self.samples: list[dict[str, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        self.samples.append(
            {
                "minute": round((time.monotonic() - self._started) / 60, 1),
                "warehouse_gb": round(folder_bytes(self.warehouse) / 1e9, 2),
                "free_gb": round(shutil.disk_usage(self.warehouse).free / 1e9, 2),
            }
        )


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=int, default=3000)
    parser.add_argument(
        "--native-minutes",
        type=float,
        help="minutes of the same load on PostgreSQL's subscriber (default: --minutes)",
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--window", type=float, default=10, help="minutes per reported window")
    parser.add_argument("--maintenance-interval", type=float, default=60)
    parser.add_argument(
        "--deletion-vectors",
        choices=["auto", "always", "never"],
        default="auto",
        help="table_features.deletion_vectors of pgsub's table (auto: past 256 MiB)",
    )
    parser.add_argument(
        "--retention-hours", type=float, default=168, help="maintenance.retention (at least 1)"
    )
    parser.add_argument(
        "--warehouse-in",
        choices=["disk", "s3"],
        default="disk",
        help="pgsub's warehouse: a folder, or a bucket of versitygw (a real S3 gateway)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results/soak.json"))
    return parser.parse_args()


def main() -> None:
    args = arguments()
    stop_on_sigterm()
    seconds = int(args.minutes * 60)
    native_minutes = args.native_minutes if args.native_minutes is not None else args.minutes
    publisher = bench_publisher(args.rows, ["soak_native", "soak_pgsub"])
    figures: dict[str, Any] = {
        "minutes": args.minutes,
        "native_minutes": native_minutes,
        "rate": args.rate,
        "deletion_vectors": args.deletion_vectors,
        "retention_hours": args.retention_hours,
    }
    watch: DiskWatch | None = None
    figures["warehouse"] = args.warehouse_in
    closing = contextlib.ExitStack()
    try:
        with NativeRun(publisher, "soak_native") as native:
            lags, tps, kept, _ = steady_load(
                publisher,
                "soak_native",
                rate=args.rate,
                seconds=int(native_minutes * 60),
                rows=args.rows,
                position=native.position,
            )
        their_windows = windows(lags, args.window)
        theirs = {"windows": their_windows, "tps": tps, "kept_up": kept}
        figures["native"] = theirs
        warehouse = BenchWarehouse(args.warehouse_in)
        closing.callback(warehouse.close)
        spark = build_session(SparkSettings(master="local[*]", conf=warehouse.spark_conf))
        tune_garbage_collector()
        maintenance = MaintenanceConfig(
            interval=args.maintenance_interval, retention=args.retention_hours * 3600
        )
        with PgsubRun(
            spark,
            warehouse=warehouse,
            connection=publisher.dsn("bench"),
            publications=["pub_soak_pgsub"],
            copy_data=True,
            table_features={"deletion_vectors": args.deletion_vectors},
            maintenance=maintenance,
        ) as run:
            run.start()
            run.wait_ready()
            start = table_health(spark, run, "soak_pgsub")
            with DiskWatch(run.warehouse) as watch:
                lags, tps, kept, _ = steady_load(
                    publisher,
                    "soak_pgsub",
                    rate=args.rate,
                    seconds=seconds,
                    rows=args.rows,
                    position=run.position,
                )
            end = table_health(spark, run, "soak_pgsub")
            writes = merge_writes(spark, run.location, "soak_pgsub")
            memory = peak_rss()
        our_windows = windows(lags, args.window)
        ours = {
            "windows": our_windows,
            "tps": tps,
            "kept_up": kept,
            "start": start,
            "end": end,
            "writes": writes,
            "disk": watch.samples,
            **memory,
        }
    except BaseException:
        # A soak fails after many minutes: keep what it measured, and what the publisher
        # said about it.
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = {**figures, "failed": True, "disk": watch.samples if watch else []}
        args.out.write_text(json.dumps(partial, indent=2))
        print(f"what was measured before the failure: {args.out}")
        kept_log = args.out.with_suffix(".publisher.log")
        kept_log.write_text(publisher.log_tail(400))
        print(f"the publisher's last log lines: {kept_log}")
        raise
    finally:
        discard_cluster(publisher)
        closing.close()
    figures["pgsub"] = ours
    report(args, figures)


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    ours, native_minutes = figures["pgsub"], figures["native_minutes"]
    our_windows, their_windows = ours["windows"], figures["native"]["windows"]
    start, end = ours["start"], ours["end"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    print(
        f"\nsoak, {args.rate}/s, pgsub {args.minutes:g} min, PostgreSQL's subscriber"
        f" {native_minutes:g} min: lag p50 / p99 / max per window (s)"
    )
    print("| window | pgsub | PostgreSQL subscriber |\n|---|---|---|")
    for number, mine in enumerate(our_windows):
        other = their_windows[number] if number < len(their_windows) else None
        theirs_text = (
            f"{other['p50']:.2f} / {other['p99']:.2f} / {other['max']:.2f}" if other else "-"
        )
        print(
            f"| {number + 1} | {mine['p50']:.2f} / {mine['p99']:.2f} / {mine['max']:.2f}"
            f" | {theirs_text} |"
        )
    print(f"pgsub table at the start: {start}; at the end: {end}")
    print(f"what each MERGE wrote (p50 / max): {ours['writes']}")
    disk = ours["disk"]
    if disk:
        hours = max(disk[-1]["minute"] - disk[0]["minute"], 1e-9) / 60
        growth = (disk[-1]["warehouse_gb"] - disk[0]["warehouse_gb"]) / hours
        print(
            f"warehouse {disk[0]['warehouse_gb']} -> {disk[-1]['warehouse_gb']} GB"
            f" (peak {max(d['warehouse_gb'] for d in disk)} GB; {growth:.1f} GB an hour),"
            f" disk free {disk[0]['free_gb']} -> {disk[-1]['free_gb']} GB"
        )


if __name__ == "__main__":
    main()
