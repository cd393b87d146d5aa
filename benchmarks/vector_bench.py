"""A big table's batch written by pgsub with deletion vectors, alone (no PostgreSQL).

One local Delta table of R rows with deletion vectors on (made by Spark,
as pgsub's copy would leave it); then each "batch" updates U random rows,
written by ``LocalMerges`` through ``apply/delta/writer/vector_write.py``, one after
another. It prints each batch's seconds (the first reads and sorts the
keys) and cProfile's heaviest calls of the last: the figures behind
docs/apply.md, "Big tables on a local warehouse".

    python -m benchmarks.vector_bench --rows 10000000 --updates 6000
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time
from pathlib import Path

from apply.batching.collapse import KeyedNet, collapse
from apply.columns.schema import target_schema
from apply.core.batch import Batch
from apply.core.records import CommitMark
from apply.core.transactions import RemoteTransaction, change_size
from apply.delta.spark.session import SparkSettings, build_session
from apply.delta.writer.local_merge import LocalMerges
from benchmarks.local_merge_bench import _relation, _update
from subscriber.replication.lsn import ZERO, Lsn


def _create(path: str, rows: int) -> None:
    session = build_session(
        SparkSettings(
            master="local[2]", app_name="vector-bench", conf={"spark.driver.memory": "4g"}
        )
    )
    try:
        session.sql(
            f"CREATE TABLE delta.`{path}` (id INT, v STRING) USING delta"
            " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
        )
        frame = session.range(0, rows).selectExpr(
            "CAST(id AS INT) AS id", "CONCAT(CAST(id AS STRING), REPEAT('x', 80)) AS v"
        )
        frame.coalesce(4).write.format("delta").mode("append").save(path)
    finally:
        session.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--updates", type=int, default=6_000, help="random rows per batch")
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pgsub-vector-bench-") as root:
        path = str(Path(root, "t"))
        started = time.perf_counter()
        _create(path, args.rows)
        print(f"table of {args.rows:,} rows made by Spark in {time.perf_counter() - started:.1f} s")
        relation = _relation(0)
        schema = target_schema(relation, lambda oid: None, True)
        merges = LocalMerges()
        profile = cProfile.Profile()
        for number in range(1, args.batches + 1):
            keys = random.sample(range(args.rows), args.updates)
            changes = tuple(_update(relation, key, f"r{number}") for key in keys)
            end = Lsn(1_000_000 * number)
            size = sum(map(change_size, changes))
            tx = RemoteTransaction(700, Lsn(end - 8), end, 0, changes, size=size)
            net = collapse(Batch([tx]).tables(lambda name: ZERO)["public.t0"])
            assert isinstance(net, KeyedNet)
            last = number == args.batches
            started = time.perf_counter()
            if last:
                profile.enable()
            written = merges.merge(path, schema, net, CommitMark("bench", end, 0))
            if last:
                profile.disable()
            seconds = time.perf_counter() - started
            assert written is not None and written.updated == args.updates
            print(f"batch {number}: {args.updates:,} updates in {seconds:.3f} s")
        pstats.Stats(profile).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
