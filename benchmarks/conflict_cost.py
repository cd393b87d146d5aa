"""What conflict detection costs on the conflict-free path: batch apply time, on and off.

The workload of the apply benchmark's catch-up scenario: a table of N rows
(default 1,000,000; bigint key, int, text, timestamptz, numeric) and one
UPDATE of every row, applied as batches of ``--batch`` changes (the
``batch.max_changes`` default, 100,000). Each batch is written twice over,
alternating, to the same Delta table:

- on: ``DeltaTables.write`` with PostgreSQL's default actions - the MERGE
  carries the insert_exists/update_exists clause, its counts are checked
  against the source's, and the table's commits are watched for other
  writers (*_origin_differs);
- off: the same MERGE without the conflict clause, nothing checked after.

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

from apply.collapse import First, KeyedNet, KeyedRow
from apply.delta_writer import CommitMark, DeltaTables
from apply.schema import TargetSchema, target_schema
from apply.source import empty
from apply.spark_session import SparkSettings, build_session
from conflicts.kinds import DEFAULTS, ConflictKind, Resolution
from subscriber.lsn import Lsn
from subscriber.messages import TEXT, Column, Relation, ReplicaIdentity, TupleData

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
    tables.copy_into(schema, iter([block]), CommitMark("bench", Lsn(1), 0))


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

    spark = build_session(SparkSettings())
    warehouse = Path(tempfile.mkdtemp(prefix="pgsub-conflict-cost-"))
    try:
        tables = DeltaTables(spark, str(warehouse), "bench")
        schema = target_schema(RELATION, lambda oid: None, keyed=True)
        tables.prepare(schema)
        started = time.perf_counter()
        load(tables, schema, args.rows)
        print(f"loaded {args.rows:,} rows in {time.perf_counter() - started:.1f} s")
        seconds: dict[str, list[float]] = {"on": [], "off": []}
        lsn = 100
        path = tables.path(schema.table)
        # Warm-up, not counted: the first MERGE of a session, the first history read.
        tables.write(schema, updates(1, 1000, n=1), CommitMark("bench", Lsn(lsn), 0), DEFAULTS)
        tables._merge_net(
            schema,
            updates(1, 1000, n=2),
            CommitMark("bench", Lsn(lsn + 50), 0),
            path,
            APPLY_EVERYTHING,
        )
        for number, first in enumerate(range(1, args.rows + 1, args.batch)):
            count = min(args.batch, args.rows - first + 1)
            # Alternate which goes first, so neither always meets a warmer cache.
            order = ("on", "off") if number % 2 == 0 else ("off", "on")
            for mode in order:
                net = updates(first, count, n=lsn)
                lsn += 100
                mark = CommitMark("bench", Lsn(lsn), 0)
                began = time.perf_counter()
                if mode == "on":
                    result = tables.write(schema, net, mark, DEFAULTS)
                    assert not result.conflicts, result.conflicts
                else:
                    # The MERGE alone: no conflict clause, no check after (private on purpose).
                    tables._merge_net(schema, net, mark, path, APPLY_EVERYTHING)
                seconds[mode].append(time.perf_counter() - began)
            print(
                f"batch {number + 1}: on {seconds['on'][-1]:.2f} s, off {seconds['off'][-1]:.2f} s"
            )
    finally:
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)

    on, off = sum(seconds["on"]), sum(seconds["off"])
    figures = {
        "rows": args.rows,
        "batch": args.batch,
        "batches": len(seconds["on"]),
        "on_seconds": seconds["on"],
        "off_seconds": seconds["off"],
        "on_total": on,
        "off_total": off,
        "on_median": statistics.median(seconds["on"]),
        "off_median": statistics.median(seconds["off"]),
        "overhead": on / off - 1,
    }
    print(
        f"\n{args.rows:,}-row UPDATE in batches of {args.batch:,}: detection on {on:.1f} s,"
        f" off {off:.1f} s; median batch {figures['on_median']:.2f} s vs"
        f" {figures['off_median']:.2f} s; cost of detection {figures['overhead']:+.1%}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
