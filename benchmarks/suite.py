"""`make bench`: every scenario, pgsub beside PostgreSQL's own subscriber and the raw limit.

Runs each benchmark in its own process (so peak memory is the scenario's
own), one after the other, on throwaway PostgreSQL 15 clusters:

| scenario | pgsub | PostgreSQL subscriber | raw limit |
|---|---|---|---|
| initial sync, N rows | rows/s to READY | rows/s to READY | COPY ... TO STDOUT rows/s |
| stream decode, one N-row transaction | receive + decode rows/s | - | receive-only rows/s |
| catch-up, one N-row UPDATE | rows/s commit->applied | same | receive-only stream rows/s |
| steady load, single-row updates at a fixed rate | p50/p99/max lag, kept up? | same | - |
| large transaction, N rows, streaming on | rows/s commit->applied, peak RSS | same | - |
| soak, a steady rate for M minutes | lag p99 first vs last window, table files | same | - |
| ceiling, stepped rates | the highest rate kept up with | same | pgbench's own rate |
| many tables, T x R rows | seconds to all READY; lag and drain under a spread load | same | - |
| cold start, T x R rows | `pgsub run` to all READY | CREATE SUBSCRIPTION to all READY | - |
| backlog, 200,000 single-row UPDATEs | seconds to drain after a restart | same | - |

then prints one table with the ratios pgsub / PostgreSQL and pgsub / raw,
and pgsub's peak RSS (Python / JVM) in each scenario, and writes every figure
to one JSON file. ``--report`` prints that table again from the JSON file.

    python -m benchmarks.suite --rows 1000000 --sync-rows 2000000 --rate 3000 --seconds 60 \
        --large-rows 5000000 --soak-minutes 10 --soak-native-minutes 10 \
        --ceiling-rates 1000,2000,4000,8000 --tables 200 --table-rows 2000 --table-rate 1000

A quick run: ``--rows 100000 --sync-rows 200000 --seconds 15 --large-rows 500000
--soak-minutes 2 --ceiling-rates 1000,4000``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from benchmarks.harness import shared_trash, stop_on_sigterm
from benchmarks.memory import jvm_text

# Each scenario's figures, in bench-<name>.json beside --out. A stored run from before the
# backlog was added has none: ``render`` leaves its row out.
SCENARIOS = ("sync", "stream", "apply", "large", "soak", "ceiling", "tables", "cold", "backlog")


def run(module: str, *arguments: str) -> None:
    command = [sys.executable, "-m", f"benchmarks.{module}", *arguments]
    print(f"\n$ {' '.join(command)}", flush=True)
    subprocess.run(command, check=True)  # noqa: S603 - our own modules, our arguments


def ratio(mine: float | None, theirs: float | None) -> str:
    return f"{mine / theirs:.2f}x" if mine and theirs else "-"


def lag(figures: dict[str, Any]) -> str:
    kept = "kept up" if figures["kept_up"] else "fell behind"
    return (
        f"{figures['lag_p50']:.2f} / {figures['lag_p99']:.2f} / {figures['lag_max']:.2f} s, {kept}"
    )


def mb(value: float | None) -> str:
    return f"{value or 0:,.0f}"


def memory(figures: dict[str, Any], python: str = "peak_rss_python_mb") -> str:
    """pgsub's peak RSS in a scenario, Python / JVM; a run before it was recorded: -."""
    if figures.get(python) is None:
        return "-"
    jvm = figures.get("peak_rss_jvm_mb")
    return f"{mb(figures[python])} / {jvm_text(jvm)}"


def soak_row(soak: dict[str, Any]) -> str:
    def p99s(figures: dict[str, Any]) -> str:
        windows = figures["windows"]
        return f"{windows[0]['p99']:.2f} -> {windows[-1]['p99']:.2f} s" if windows else "-"

    ours = soak["pgsub"]
    files = f"files {ours['start']['data_files']} -> {ours['end']['data_files']}"
    return (
        f"| soak, {soak['rate']}/s for {soak['minutes']:g} min"
        f" (PostgreSQL's {soak.get('native_minutes', soak['minutes']):g}):"
        " lag p99, first -> last window"
        f" | {p99s(ours)}, {files} | {p99s(soak['native'])} | - | - | - | {memory(ours)} |"
    )


def ceiling_row(ceiling: dict[str, Any]) -> str:
    ours, theirs = ceiling["pgsub_highest_tps"], ceiling["native_highest_tps"]
    asked = max((r["tps"] for r in ceiling["native"]), default=0)
    return (
        f"| ceiling: highest steady rate kept up with (tx/s) | {ours:,.0f} | {theirs:,.0f}"
        f" | pgbench reached {asked:,.0f} | {ratio(ours, theirs)} | - |"
        f" {memory(ceiling.get('pgsub_memory', {}))} |"
    )


def tables_rows(tables: dict[str, Any]) -> str:
    args, ours, theirs = tables["args"], tables["pgsub"], tables["native"]
    shape = f"{int(args['tables']):,} tables x {int(args['rows']):,} rows"

    def drained(figures: dict[str, Any]) -> str:
        seconds = figures["drain_seconds"]
        return "not drained" if seconds is None else f"drained {seconds:.1f} s after"

    speed = ratio(theirs["sync_seconds"], ours["sync_seconds"])  # time: theirs / ours
    return "\n".join(
        [
            f"| initial sync, {shape}: seconds to all READY | {ours['sync_seconds']:.1f}"
            f" | {theirs['sync_seconds']:.1f} | - | {speed} | - | {memory(ours)} |",
            f"| same, {args['rate']} updates/s spread over them for {args['seconds']} s:"
            f" lag p50 / p99 / max | {lag(ours)}, {drained(ours)} | {lag(theirs)},"
            f" {drained(theirs)} | - | - | - | same process |",
        ]
    )


def backlog_row(backlog: dict[str, Any]) -> str:
    ours, theirs = backlog["pgsub"], backlog["native"]
    return (
        f"| backlog, {ours['transactions']:,} single-row UPDATEs written while each subscriber"
        f" was down: seconds to drain | {ours['drain_seconds']:.2f}"
        f" | {theirs['drain_seconds']:.2f} | - |"
        f" {ratio(theirs['drain_seconds'], ours['drain_seconds'])} | - | {memory(ours)} |"
    )


def cold_row(cold: dict[str, Any]) -> str:
    args, ours, theirs = cold["args"], cold["pgsub"], cold["native"]
    shape = f"{int(args['tables']):,} tables x {int(args['rows']):,} rows"
    return (
        f"| cold start, {shape}: seconds from `pgsub run` (PostgreSQL: from CREATE"
        f" SUBSCRIPTION) to all READY | {ours['ready_seconds'] or 0:.1f}"
        f" | {theirs['sync_seconds']:.1f} | - |"
        f" {ratio(theirs['sync_seconds'], ours['ready_seconds'])} | - | {memory(ours)} |"
    )


def table(
    sync: dict[str, Any], stream: dict[str, Any], apply: dict[str, Any], large: dict[str, Any]
) -> str:
    first = sync["pgsub"][0]  # one run: ranges auto
    ours_sync = first["rows_per_s"] or 0.0
    theirs_sync = sync["native_rows_per_s"]
    ours_update = apply["pgsub"]["update_rows_per_s"]
    theirs_update = apply["native"]["update_rows_per_s"]
    receive = stream["receive_only_rows_per_s"]
    ours_large = large["pgsub"]
    lines = [
        "| scenario | pgsub | PostgreSQL subscriber | raw limit | pgsub / PostgreSQL"
        " | pgsub / raw | pgsub peak RSS, Python / JVM (MB) |",
        "|---|---|---|---|---|---|---|",
        f"| initial sync, {sync['rows']:,} rows: rows/s to READY | {ours_sync:,.0f}"
        f" | {theirs_sync or 0:,.0f} | COPY read {sync['raw_copy_rows_per_s']:,.0f}"
        f" | {ratio(ours_sync, theirs_sync)} | {ratio(ours_sync, sync['raw_copy_rows_per_s'])}"
        f" | {memory(first)} |",
        f"| stream decode, one {stream['rows']:,}-row transaction: rows/s received and"
        f" decoded | {stream['receive_decode_rows_per_s']:,.0f} | - | receive-only"
        f" {receive:,.0f} | - | {ratio(stream['receive_decode_rows_per_s'], receive)} | - |",
        f"| catch-up, one {int(apply['args']['rows']):,}-row UPDATE: rows/s commit->applied"
        f" | {ours_update:,.0f} | {theirs_update:,.0f} | stream receive-only {receive:,.0f}"
        f" | {ratio(ours_update, theirs_update)} | {ratio(ours_update, receive)}"
        f" | {memory(apply['pgsub'])} (with the steady load) |",
        f"| steady load, {apply['args']['rate']}/s single-row updates for"
        f" {apply['args']['seconds']} s: lag p50 / p99 / max | {lag(apply['pgsub'])}"
        f" | {lag(apply['native'])} | - | - | - | same process |",
        f"| large transaction, {large['rows']:,} rows, streaming on: rows/s commit->applied"
        f" | {ours_large['rows_per_s']:,.0f} | {large['native']['rows_per_s']:,.0f}"
        f" (apply worker {mb(large['native']['peak_rss_mb'])} MB) | -"
        f" | {ratio(ours_large['rows_per_s'], large['native']['rows_per_s'])} | -"
        f" | {memory(ours_large, 'peak_rss_mb')} (spooled {mb(ours_large['peak_spill_mb'])} MB)"
        " |",
    ]
    return "\n".join(lines)


def render(figures: dict[str, Any]) -> str:
    """The run's table: every scenario, a row each (``figures``: bench.json's)."""
    return "\n".join(
        [
            table(figures["sync"], figures["stream"], figures["apply"], figures["large"]),
            tables_rows(figures["tables"]),
            cold_row(figures["cold"]),
            *([backlog_row(figures["backlog"])] if "backlog" in figures else []),
            soak_row(figures["soak"]),
            ceiling_row(figures["ceiling"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="catch-up UPDATE size")
    parser.add_argument("--sync-rows", type=int, default=2_000_000, help="initial sync size")
    parser.add_argument("--rate", type=int, default=3000, help="steady load, transactions/s")
    parser.add_argument("--seconds", type=int, default=60, help="steady load duration")
    parser.add_argument("--large-rows", type=int, default=5_000_000, help="streamed INSERT size")
    parser.add_argument("--soak-minutes", type=float, default=10)
    parser.add_argument(
        "--soak-native-minutes",
        type=float,
        help="PostgreSQL's subscriber's share of the soak (default: --soak-minutes)",
    )
    parser.add_argument("--ceiling-rates", default="1000,2000,4000,8000")
    parser.add_argument("--tables", type=int, default=200, help="many-tables scenario")
    parser.add_argument("--table-rows", type=int, default=2000)
    parser.add_argument("--table-rate", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench.json"))
    parser.add_argument(
        "--report", action="store_true", help="print the table of the run in --out, run nothing"
    )
    args = parser.parse_args()
    if args.report:
        stored = json.loads(args.out.read_text())
        print(render(stored))
        print(", ".join(f"{k}: {v}" for k, v in stored["machine"].items()))
        return
    stop_on_sigterm()
    folder = args.out.parent
    folder.mkdir(parents=True, exist_ok=True)
    # Every scenario's folders are removed once they have all run, not before the next one
    # (``benchmarks.harness.discard``).
    with shared_trash():
        _scenarios(args, folder)
    figures = {name: json.loads((folder / f"bench-{name}.json").read_text()) for name in SCENARIOS}
    machine = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {_cores()} cores",
        "python": platform.python_version(),
        "pyspark": version("pyspark"),
        "delta-spark": version("delta-spark"),
        "command": " ".join(sys.argv),
    }
    print("\n" + render(figures))
    print(", ".join(f"{k}: {v}" for k, v in machine.items()))
    args.out.write_text(json.dumps({"machine": machine, **figures}, indent=2))
    print(f"figures written to {args.out}")


def _scenarios(args: argparse.Namespace, folder: Path) -> None:
    """Each scenario in its own process, one after the other; each writes its figures to
    ``bench-<name>.json`` in ``folder``."""
    sync_json, stream_json, apply_json, large_json = (
        folder / f"bench-{n}.json" for n in ("sync", "stream", "apply", "large")
    )

    run("sync_bench", "--rows", str(args.sync_rows), "--out", str(sync_json))
    run("stream_decode", "--rows", str(args.rows), "--major", "15", "--json", str(stream_json))
    run(
        "apply_bench",
        *("--rows", str(args.rows), "--rate", str(args.rate), "--seconds", str(args.seconds)),
        *("--out", str(apply_json)),
    )
    run("large_tx", "--rows", str(args.large_rows), "--out", str(large_json))
    soak_json, ceiling_json = folder / "bench-soak.json", folder / "bench-ceiling.json"
    tables_json = folder / "bench-tables.json"
    run(
        "tables_bench",
        *("--tables", str(args.tables), "--rows", str(args.table_rows)),
        *("--rate", str(args.table_rate), "--seconds", str(max(args.seconds, 120))),
        *("--out", str(tables_json)),
    )
    cold_json = folder / "bench-cold.json"
    run(
        "cold_start",
        *("--tables", str(args.tables), "--rows", str(args.table_rows), "--out", str(cold_json)),
    )
    run("backlog", "--rows", str(args.rows), "--out", str(folder / "bench-backlog.json"))
    run(
        "ceiling",
        *("--rates", args.ceiling_rates, "--seconds", str(args.seconds)),
        *("--out", str(ceiling_json)),
    )
    native_minutes = args.soak_native_minutes or args.soak_minutes
    run(  # last: the longest, and every figure before it is already on disk
        "soak",
        *("--minutes", str(args.soak_minutes), "--native-minutes", str(native_minutes)),
        *("--rate", str(args.rate), "--window", str(max(1.0, args.soak_minutes / 6))),
        *("--out", str(soak_json)),
    )


def _cores() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    main()
