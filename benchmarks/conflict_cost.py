"""What conflict detection costs on the conflict-free path: batch apply time, on and off.

The workload of the apply benchmark's catch-up scenario: a table of N rows
(default 1,000,000; bigint key, int, text, timestamptz, numeric) and one
UPDATE of every row, applied as batches of ``--batch`` changes (the
``batch.max_changes`` default, 100,000). Three copies of the table, each
batch written to all three, rotating which goes first:

- detection (default): ``DeltaTables.write`` with PostgreSQL's default
  actions - the MERGE carries the insert_exists/update_exists clause when
  the batch can meet it, its counts are checked against the source's, and
  the table's commits are watched for other writers;
- detection + track_origin: the same on a table with Delta row tracking,
  which *_origin_differs needs;
- off: the bare MERGE on a table without row tracking: no conflict clause,
  nothing checked after.

Both include turning the batch into Arrow and Spark rows, as the apply
does. One warm-up write of each kind comes first and is not counted (the
session's first MERGE; the one-time read of the table's history). Nothing
here is a test: it prints the figures and writes JSON.

    python -m benchmarks.conflict_cost --rows 1000000 --batch 100000
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from apply.batching.collapse import KeyedNet, KeyedRow
from apply.batching.copy_source import CopySource
from apply.batching.source import empty
from apply.columns.schema import TargetSchema, target_schema
from apply.core.records import CommitMark
from apply.delta.spark.keyed import merge_net
from apply.delta.spark.session import SparkSettings, build_session
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from benchmarks.harness import stop_on_sigterm
from conflicts.kinds import DEFAULTS, ConflictKind, First, Resolution
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import TEXT, Column, Relation, ReplicaIdentity, TupleData
from subscriber.runtime.daemon import tune_garbage_collector

NUMERIC_12_2 = ((12 << 16) | 2) + 4
RELATION = Relation(
    16384,
    "public",
    "bench",
    ReplicaIdentity.DEFAULT,
    (
        Column("id", 20, -1, True),
        Column("n", 23, -1, False),
        Column("t", 25, -1, False),
        Column("ts", 1184, -1, False),
        Column("amount", 1700, NUMERIC_12_2, False),
    ),
)
APPLY_EVERYTHING = {kind: Resolution.APPLY_REMOTE for kind in ConflictKind}
DEFAULT, ORIGIN, OFF = "detection (default)", "detection + track_origin", "off"
MODES = (DEFAULT, ORIGIN, OFF)
STAMP = b"2026-11-22 12:00:00.123456+00"


def load(tables: DeltaTables, schema: TargetSchema, rows: int) -> None:
    """The table's N rows, as the initial copy writes them."""
    layout = empty(schema).schema
    ids = pa.array(range(1, rows + 1), type=pa.int64())
    block = pa.table(
        {
            "id": ids,
            "n": pa.array([0] * rows, type=pa.int32()),
            "t": pa.array([f"row {i}" for i in range(1, rows + 1)]),
            "ts": pa.array([datetime(2026, 1, 1, tzinfo=UTC)] * rows),
            "amount": pa.array([i / 100 for i in range(1, rows + 1)]),
        }
    ).cast(layout)
    with tempfile.TemporaryDirectory() as staging:
        tables.copy_into(
            schema, CopySource.in_memory([block]), CommitMark("bench", Lsn(1), 0), Path(staging)
        )


def updates(first: int, count: int, n: int) -> KeyedNet:
    """One UPDATE chain per key ``first .. first+count-1``, as collapse makes them."""
    net = KeyedNet(RELATION, ("id",))
    for i in range(first, first + count):
        key = str(i).encode()
        image = TupleData(
            bytes([TEXT] * 5), (key, str(n).encode(), b"row %d" % i, STAMP, b"%d.25" % (i % 10**6))
        )
        net.rows[(key,)] = KeyedRow((key,), First.UPDATE, 0, True, image)
    return net


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path("bench-results/conflict_cost.json"))
    args = parser.parse_args()
    stop_on_sigterm()

    spark = build_session(SparkSettings())

    tune_garbage_collector()  # as `pgsub run` does
    warehouse = Path(tempfile.mkdtemp(prefix="pgsub-conflict-cost-"))
    try:
        schema = target_schema(RELATION, lambda oid: None, keyed=True)
        tables = {
            mode: DeltaTables(
                spark, str(warehouse / mode), "bench", TableOptions(track_origin=mode == ORIGIN)
            )
            for mode in MODES
        }
        for mode, target in tables.items():
            target.prepare(schema)
            started = time.perf_counter()
            load(target, schema, args.rows)
            print(f"{mode}: loaded {args.rows:,} rows in {time.perf_counter() - started:.1f} s")
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        # Warm-up, not counted: the first MERGE of a session, the first history read.
        warm = CommitMark("bench", Lsn(100), 0)
        for mode in MODES:
            write(tables[mode], mode, schema, updates(1, 1000, n=1), warm)
        lsn = 100
        for number, first in enumerate(range(1, args.rows + 1, args.batch)):
            count = min(args.batch, args.rows - first + 1)
            lsn += 100
            mark = CommitMark("bench", Lsn(lsn), 0)
            # Rotate which goes first, so none always meets a warmer cache.
            for mode in MODES[number % 3 :] + MODES[: number % 3]:
                net = updates(first, count, n=lsn)
                began = time.perf_counter()
                write(tables[mode], mode, schema, net, mark)
                seconds[mode].append(time.perf_counter() - began)
            print(
                f"batch {number + 1}: "
                + ", ".join(f"{mode} {seconds[mode][-1]:.2f} s" for mode in MODES)
            )
    finally:
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)

    totals = {mode: sum(seconds[mode]) for mode in MODES}
    figures = {
        "rows": args.rows,
        "batch": args.batch,
        "seconds": seconds,
        "total": totals,
        "median": {mode: statistics.median(seconds[mode]) for mode in MODES},
        "cost_default": totals[DEFAULT] / totals[OFF] - 1,
        "cost_track_origin": totals[ORIGIN] / totals[OFF] - 1,
    }
    print(f"\n{args.rows:,}-row UPDATE in batches of {args.batch:,}:")
    print("| mode | total | median batch | cost vs off |\n|---|---|---|---|")
    for mode in MODES:
        cost = totals[mode] / totals[OFF] - 1
        print(f"| {mode} | {totals[mode]:.1f} s | {figures['median'][mode]:.2f} s | {cost:+.1%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(f"figures written to {args.out}")


def write(
    tables: DeltaTables, mode: str, schema: TargetSchema, net: KeyedNet, mark: CommitMark
) -> None:
    if mode == OFF:
        # The MERGE alone: no conflict clause, no check after.
        merge_net(tables.target(schema.table), schema, net, mark, APPLY_EVERYTHING)
    else:
        result = tables.write(schema, net, mark, DEFAULTS)
        assert not result.conflicts, result.conflicts


if __name__ == "__main__":
    main()
