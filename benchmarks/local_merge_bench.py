"""Where a many-table batch's time goes when delta-rs merges it (no PostgreSQL, no Spark).

N local Delta tables of R rows; each "batch" updates U rows of every table,
merged one table after another by ``LocalMerges`` (apply/delta/writer/local_merge.py),
as the applier's threads would (a table up to ``--rewrite-max-bytes`` rewritten whole,
``apply/plans/rewrite.py``). It prints each batch's seconds and, for the
last one, cProfile's heaviest calls: the figures behind docs/performance.md,
"A small table's batch through delta-rs".

    python -m benchmarks.local_merge_bench --tables 200 --rows 2000 --updates 35
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deltalake
import pyarrow as pa

from apply.batching.collapse import KeyedNet, collapse
from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetSchema, target_schema
from apply.core.batch import Batch
from apply.core.records import CommitMark
from apply.core.transactions import Op, RemoteTransaction, RowChange, change_size
from apply.delta.writer import delta_rs_merge
from apply.delta.writer.local_merge import LocalMerges
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import TEXT, Column, Relation, ReplicaIdentity, TupleData

INT4, TEXT_OID = 23, 25


def _relation(number: int) -> Relation:
    columns = (Column("id", INT4, -1, True), Column("v", TEXT_OID, -1, False))
    return Relation(16384 + number, "public", f"t{number}", ReplicaIdentity.DEFAULT, columns)


def _update(relation: Relation, key: int, value: str) -> RowChange:
    image = TupleData(bytes([TEXT, TEXT]), (str(key).encode(), value.encode()))
    return RowChange(relation, Op.UPDATE, image, None)


def _nets(relations: list[Relation], updates: int, round_: int) -> dict[str, KeyedNet]:
    transactions = []
    for number, relation in enumerate(relations):
        changes = tuple(_update(relation, k, f"r{round_}") for k in range(updates))
        end = Lsn(1_000_000 * round_ + 8 * number + 8)
        size = sum(map(change_size, changes))
        transactions.append(RemoteTransaction(700, Lsn(end - 8), end, 0, changes, size=size))
    work = Batch(transactions).tables(lambda name: ZERO)
    nets = {}
    for name, table_work in work.items():
        net = collapse(table_work)
        assert isinstance(net, KeyedNet)
        nets[name] = net
    return nets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--updates", type=int, default=35, help="rows updated per table")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="tables merged at once (the applier uses 4)"
    )
    parser.add_argument(
        "--rewrite-max-bytes",
        type=int,
        default=delta_rs_merge.REWRITE_MAX_BYTES,
        help="tables up to this size are rewritten whole (-1: every table merged)",
    )
    args = parser.parse_args()
    setattr(delta_rs_merge, "REWRITE_MAX_BYTES", args.rewrite_max_bytes)  # noqa: B010 - a Final, for this run
    relations = [_relation(n) for n in range(args.tables)]
    schemas: dict[str, TargetSchema] = {
        r.qualified_name: target_schema(r, lambda oid: None, True) for r in relations
    }
    with tempfile.TemporaryDirectory(prefix="pgsub-merge-bench-") as root:
        for name, schema in schemas.items():
            rows = pa.table(
                {"id": pa.array(range(args.rows), pa.int32()), "v": ["v"] * args.rows}
            ).cast(arrow_schema(schema.columns))
            deltalake.write_deltalake(str(Path(root, name)), rows)
        merges = LocalMerges()
        profile = cProfile.Profile()
        for round_ in range(1, args.batches + 1):
            nets = _nets(relations, args.updates, round_)
            last = round_ == args.batches
            started = time.perf_counter()
            if last and args.threads == 1:
                profile.enable()
            mark = CommitMark("bench", Lsn(1_000_000 * round_ + 8 * args.tables), 0)

            def merge(name: str, mark: CommitMark = mark, nets: dict[str, KeyedNet] = nets) -> None:
                written = merges.merge(str(Path(root, name)), schemas[name], nets[name], mark)
                assert written is not None and written.updated == args.updates

            if args.threads == 1:
                for name in nets:
                    merge(name)
            else:
                with ThreadPoolExecutor(args.threads) as pool:
                    list(pool.map(merge, nets))
            profile.disable()
            print(f"batch {round_}: {time.perf_counter() - started:.2f} s, {args.tables} tables")
        if args.threads == 1:
            pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
