"""What a batch writes, at every table size and rate, with the project's defaults.

A table of ``--rows`` rows (one per ``--sizes``), copied by pgsub, then pgbench
single-row updates of random rows at ``--rate`` per second for ``--minutes``,
with the daemon's maintenance thread. Reported per size:

- the table's size after the copy and the warehouse's growth over the run
  (and per hour at that rate: what ``maintenance.retention`` keeps of it);
- the bytes each batch's commit wrote (its data and vector files and the
  commit itself, ``apply.delta.writer.write_cost.commit_bytes``, read from the
  table's log), p50 / p99 / max, beside the bytes of the rows the batches
  changed (as the publisher sent them: ``pgsub_table_change_bytes_total``);
- the lag at the slot, p50 / p99, and, with ``--native``, PostgreSQL's own
  subscriber's under the same load.

    python -m benchmarks.writes --rows 1000000 --rate 10 --minutes 10 --native
    python -m benchmarks.writes --rate 1000 --minutes 2 \
        --sizes 10000,100000,1000000,10000000,50000000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from apply.delta.files.local_store import LocalStore
from apply.delta.files.store import commit_name
from apply.delta.spark.session import SparkSettings, build_session
from apply.delta.writer.write_cost import commit_bytes
from benchmarks.harness import (
    NativeRun,
    PgsubRun,
    bench_publisher,
    discard_cluster,
    folder_bytes,
    percentile,
    steady_load,
    stop_on_sigterm,
)
from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.daemon import tune_garbage_collector

TABLE = "writes_pgsub"


def batch_commits(folder: Path, after: int) -> list[int]:
    """The bytes each commit of pgsub's batches wrote, after version ``after``."""
    store = LocalStore(str(folder))
    written = []
    version = after + 1
    while store.exists(commit_name(version)):
        lines = store.read(commit_name(version)).decode().splitlines()
        info = json.loads(lines[0]).get("commitInfo", {})
        if '"pgsub"' in str(info.get("userMetadata") or ""):  # a batch's (its mark)
            written.append(commit_bytes(lines).written)
        version += 1
    return written


def latest(folder: Path) -> int:
    versions = [int(p.name.split(".")[0]) for p in (folder / "_delta_log").glob("*.json")]
    return max(versions)


def one_size(spark: Any, rows: int, args: argparse.Namespace) -> dict[str, Any]:
    seconds = int(args.minutes * 60)
    names = [TABLE, "writes_native"] if args.native else [TABLE]
    publisher = bench_publisher(rows, names)
    figures: dict[str, Any] = {"rows": rows, "rate": args.rate, "minutes": args.minutes}
    try:
        if args.native:
            with NativeRun(publisher, "writes_native") as native:
                load = steady_load(
                    publisher,
                    "writes_native",
                    rate=args.rate,
                    seconds=seconds,
                    rows=rows,
                    position=native.position,
                )
            figures["native"] = {
                "lag_p50": percentile(load.lags, 0.5),
                "lag_p99": percentile(load.lags, 0.99),
                "tps": load.tps,
                "kept_up": load.kept_up,
            }
        maintenance = MaintenanceConfig(interval=args.maintenance_interval)
        with PgsubRun(
            spark,
            connection=publisher.dsn("bench"),
            publications=[f"pub_{TABLE}"],
            copy_data=True,
            maintenance=maintenance,
        ) as run:
            run.start()
            run.wait_ready()
            folder = run.warehouse / "public" / TABLE
            copied_at = latest(folder)
            table_bytes, warehouse_before = folder_bytes(folder), folder_bytes(run.warehouse)
            started = time.monotonic()
            load = steady_load(
                publisher, TABLE, rate=args.rate, seconds=seconds, rows=rows, position=run.position
            )
            elapsed = time.monotonic() - started
            warehouse_after = folder_bytes(run.warehouse)
            per_batch = batch_commits(folder, copied_at)
            written, changed = run.runner.context.writes.totals().get(f"public.{TABLE}", (0, 0))
        growth = warehouse_after - warehouse_before
        figures["pgsub"] = {
            "table_bytes_after_copy": table_bytes,
            "batches": len(per_batch),
            "batch_bytes_p50": percentile([float(b) for b in per_batch], 0.5),
            "batch_bytes_p99": percentile([float(b) for b in per_batch], 0.99),
            "batch_bytes_max": max(per_batch, default=0),
            "bytes_written": written,
            "changed_bytes": changed,
            "changed_bytes_per_batch": changed / max(1, len(per_batch)),
            "written_per_changed": written / changed if changed else None,
            "warehouse_growth_bytes": growth,
            "growth_share_of_table": growth / table_bytes if table_bytes else None,
            "growth_per_hour_bytes": growth / elapsed * 3600,
            "lag_p50": percentile(load.lags, 0.5),
            "lag_p99": percentile(load.lags, 0.99),
            "tps": load.tps,
            "kept_up": load.kept_up,
        }
    finally:
        discard_cluster(publisher)
    return figures


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--sizes", help="rows of each table in turn, comma-separated")
    parser.add_argument("--rate", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--native", action="store_true", help="PostgreSQL's subscriber too")
    parser.add_argument("--maintenance-interval", type=float, default=300)
    parser.add_argument("--out", type=Path, default=Path("bench-results/writes.json"))
    return parser.parse_args()


def main() -> None:
    args = arguments()
    stop_on_sigterm()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [args.rows]
    spark = build_session(SparkSettings(master="local[*]"))
    tune_garbage_collector()
    results = [one_size(spark, rows, args) for rows in sizes]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"\nwrites at {args.rate} random single-row updates/s for {args.minutes:g} min")
    print(
        "| rows | table after copy | bytes a batch wrote p50 / p99 / max | rows' bytes a batch"
        " changed | warehouse growth (share of table; an hour) | lag p50 / p99 | PostgreSQL's"
        " subscriber lag p50 / p99 |\n|---|---|---|---|---|---|---|"
    )
    for result in results:
        ours, theirs = result["pgsub"], result.get("native")
        native = f"{theirs['lag_p50']:.2f} / {theirs['lag_p99']:.2f} s" if theirs else "-"
        print(
            f"| {result['rows']:,} | {ours['table_bytes_after_copy'] / 2**20:,.1f} MiB"
            f" | {ours['batch_bytes_p50'] / 2**10:,.1f} / {ours['batch_bytes_p99'] / 2**10:,.1f}"
            f" / {ours['batch_bytes_max'] / 2**10:,.1f} KiB"
            f" | {ours['changed_bytes_per_batch'] / 2**10:,.2f} KiB"
            f" | {ours['warehouse_growth_bytes'] / 2**20:,.1f} MiB"
            f" ({ours['growth_share_of_table']:.0%}; {ours['growth_per_hour_bytes'] / 2**30:,.2f}"
            f" GiB) | {ours['lag_p50']:.2f} / {ours['lag_p99']:.2f} s | {native} |"
        )


if __name__ == "__main__":
    main()
