"""Ceiling benchmark: the highest steady rate each subscriber keeps up with.

pgbench single-row updates on a 1M-row table (``--rows``) at each rate of
``--rates`` for ``--seconds``; a rate is kept up with when every sampled
WAL position was applied and the lag stayed under ``--bound`` seconds.
pgbench's achieved rate is reported too: the publisher on this machine has
a limit of its own, and a rate it cannot produce says nothing about the
subscribers.

    python -m benchmarks.ceiling --rates 1000,2000,4000,8000 --seconds 60
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness import (
    NativeRun,
    PgsubRun,
    bench_publisher,
    daemon_session,
    discard_cluster,
    percentile,
    steady_load,
    stop_on_sigterm,
)
from benchmarks.memory import peak_rss
from subscriber.replication.lsn import Lsn
from subscriber.runtime.daemon import tune_garbage_collector
from subscriber.runtime.embedded import PgCluster


def step(
    publisher: PgCluster,
    table: str,
    rates: list[int],
    args: argparse.Namespace,
    position: Callable[[], Lsn],
) -> list[dict[str, float | bool]]:
    results: list[dict[str, float | bool]] = []
    for rate in rates:
        lags, tps, kept, _ = steady_load(
            publisher, table, rate=rate, seconds=args.seconds, rows=args.rows, position=position
        )
        worst = max(lags, default=float("inf"))
        results.append(
            {
                "rate": rate,
                "tps": tps,
                "p99": percentile(lags, 0.99),
                "max": worst,
                "kept_up": kept and worst < args.bound,
            }
        )
        print(json.dumps(results[-1]), flush=True)
        if not results[-1]["kept_up"]:
            break  # higher rates will not keep up either
    return results


def highest(results: list[dict[str, float | bool]]) -> float:
    kept = [float(r["tps"]) for r in results if r["kept_up"]]
    return max(kept, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="1000,2000,4000,8000")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--bound", type=float, default=30, help="most lag that counts as kept up")
    parser.add_argument("--out", type=Path, default=Path("bench-results/ceiling.json"))
    args = parser.parse_args()
    stop_on_sigterm()
    rates = [int(r) for r in args.rates.split(",")]
    publisher = bench_publisher(args.rows, ["ceiling_native", "ceiling_pgsub"])
    try:
        with NativeRun(publisher, "ceiling_native") as native:
            theirs = step(publisher, "ceiling_native", rates, args, native.position)
        spark = daemon_session()
        tune_garbage_collector()
        with PgsubRun(
            spark,
            connection=publisher.dsn("bench"),
            publications=["pub_ceiling_pgsub"],
            copy_data=True,
        ) as run:
            run.start()
            run.wait_ready()
            ours = step(publisher, "ceiling_pgsub", rates, args, run.position)
            memory = peak_rss()
    finally:
        discard_cluster(publisher)
    figures = {
        "pgsub": ours,
        "native": theirs,
        "pgsub_highest_tps": highest(ours),
        "native_highest_tps": highest(theirs),
        "pgsub_memory": memory,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print("| rate asked | pgsub tps, p99 / max lag | PostgreSQL tps, p99 / max lag |")
    print("|---|---|---|")
    for mine, other in zip(ours, theirs + [{}] * len(ours), strict=False):
        theirs_text = (
            f"{other['tps']:,.0f}, {other['p99']:.2f} / {other['max']:.2f} s" if other else "-"
        )
        print(
            f"| {mine['rate']:,} | {mine['tps']:,.0f}, {mine['p99']:.2f} / {mine['max']:.2f} s"
            f"{'' if mine['kept_up'] else ' (fell behind)'} | {theirs_text} |"
        )
    print(
        f"highest rate kept up with: pgsub {figures['pgsub_highest_tps']:,.0f}/s,"
        f" PostgreSQL {figures['native_highest_tps']:,.0f}/s"
    )


if __name__ == "__main__":
    main()
