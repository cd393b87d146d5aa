"""Where a many-table batch's time goes when delta-rs merges it (no PostgreSQL, no Spark).

N local Delta tables of R rows; each "batch" updates U rows of every table,
merged one table after another by ``LocalMerges`` (apply/delta/writer/local_merge.py),
as the applier's threads would (a table up to ``--rewrite-max-bytes`` rewritten whole,
``apply/plans/rewrite.py``). It prints each batch's seconds and, for the
last one, cProfile's heaviest calls: the figures behind docs/performance.md,
"A small table's batch through delta-rs".

    python -m benchmarks.local_merge_bench --tables 200 --rows 2000 --updates 35
    python -m benchmarks.local_merge_bench --tables 200 --updates 8 --vectors --wide --batches 10

With ``--processes P`` the tables are shared out over P writer processes (each its own
``LocalMerges``, ``--threads`` at once), each batch's nets sent to them pickled, as a pool of
writer processes would take a batch from the apply process (docs/performance.md, "Writer
processes, measured").
"""

from __future__ import annotations

import argparse
import cProfile
import decimal
import multiprocessing
import pstats
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Final

import deltalake
import pyarrow as pa

from apply.batching.collapse import KeyedNet, collapse
from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetSchema, target_schema
from apply.core.batch import Batch
from apply.core.records import CommitMark
from apply.core.transactions import Op, RemoteTransaction, RowChange, change_size
from apply.delta.files.store import table_store
from apply.delta.writer import delta_rs_merge
from apply.delta.writer.local_merge import LocalMerges
from apply.delta.writer.protocol import vectors_on
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import TEXT, Column, Relation, ReplicaIdentity, TupleData

INT4, TEXT_OID = 23, 25


INT8, TIMESTAMPTZ, NUMERIC = 20, 1184, 1700
# bench-tables's tables (benchmarks/harness.py's TABLE): id bigint key, n int, t text,
# ts timestamptz, amount numeric(12, 2).
WIDE: Final = (
    Column("id", INT8, -1, True),
    Column("n", INT4, -1, False),
    Column("t", TEXT_OID, -1, False),
    Column("ts", TIMESTAMPTZ, -1, False),
    Column("amount", NUMERIC, (12 << 16 | 2) + 4, False),
)
NARROW: Final = (Column("id", INT4, -1, True), Column("v", TEXT_OID, -1, False))


def _relation(number: int, columns: tuple[Column, ...] = NARROW) -> Relation:
    return Relation(16384 + number, "public", f"t{number}", ReplicaIdentity.DEFAULT, columns)


def _values(relation: Relation, key: int, value: str) -> tuple[bytes, ...]:
    if relation.columns == NARROW:
        return (str(key).encode(), value.encode())
    return (
        str(key).encode(),
        str(len(value)).encode(),
        value.encode(),
        b"2026-11-29 17:00:00.123456+00",
        b"1234.56",
    )


def _update(relation: Relation, key: int, value: str) -> RowChange:
    values = _values(relation, key, value)
    image = TupleData(bytes([TEXT] * len(values)), values)
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


def _first_rows(count: int, columns: tuple[Column, ...]) -> pa.Table:
    if columns == NARROW:
        return pa.table({"id": range(count), "v": ["v"] * count})
    when = pa.scalar(1_795_000_000_000_000, pa.timestamp("us", "UTC"))
    return pa.table(
        {
            "id": range(count),
            "n": pa.array([0] * count, pa.int32()),
            "t": ["v"] * count,
            "ts": pa.array([when] * count),
            "amount": pa.array([decimal.Decimal("0.00")] * count, pa.decimal128(12, 2)),
        }
    )


def _writer(connection: Connection, root: str, threads: int, rewrite_max_bytes: int) -> None:
    """A writer process: its share of each batch merged, the versions sent back."""
    setattr(delta_rs_merge, "REWRITE_MAX_BYTES", rewrite_max_bytes)  # noqa: B010 - as main's
    merges = LocalMerges()
    with ThreadPoolExecutor(threads) as pool:
        while (job := connection.recv()) is not None:
            mark, shares = job

            def merge(share: tuple[str, TargetSchema, KeyedNet], mark: CommitMark = mark) -> int:
                name, schema, net = share
                written = merges.merge(str(Path(root, name)), schema, net, mark)
                assert written is not None and written.version is not None, written
                return written.version

            connection.send(list(pool.map(merge, shares)))


def _make(
    root: str, schemas: dict[str, TargetSchema], rows: int, columns: tuple[Column, ...], *,
    vectors: bool,
) -> None:  # fmt: skip
    for name, schema in schemas.items():
        first = _first_rows(rows, columns).cast(arrow_schema(schema.columns))
        deltalake.write_deltalake(str(Path(root, name)), first)
        if vectors:  # turned on as pgsub does when they pay
            table = deltalake.DeltaTable(str(Path(root, name)))
            vectors_on(table_store(str(Path(root, name))), table, table.version())


def _writers(processes: int, root: str, threads: int, rewrite_max_bytes: int) -> list[Connection]:
    """``processes`` writer processes (``_writer``), started; the apply process's ends."""
    context = multiprocessing.get_context("forkserver")
    ends = []
    for _ in range(processes):
        near, far = context.Pipe()
        context.Process(
            target=_writer, args=(far, root, threads, rewrite_max_bytes), daemon=True
        ).start()
        ends.append(near)
    return ends


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
    parser.add_argument(
        "--processes", type=int, default=0, help="writer processes the tables are shared over"
    )
    parser.add_argument("--sort", default="tottime", help="cProfile's order (single thread)")
    parser.add_argument("--top", type=int, default=12, help="cProfile's lines shown")
    parser.add_argument(
        "--wide", action="store_true", help="bench-tables's five columns, not (id int, v text)"
    )
    parser.add_argument(
        "--vectors",
        action="store_true",
        help="tables made with deletion vectors on: each batch by pgsub's own vector writer "
        "(apply/delta/writer/vector_write.py), as bench-tables's tables are after their first",
    )
    args = parser.parse_args()
    setattr(delta_rs_merge, "REWRITE_MAX_BYTES", args.rewrite_max_bytes)  # noqa: B010 - a Final, for this run
    columns = WIDE if args.wide else NARROW
    relations = [_relation(n, columns) for n in range(args.tables)]
    schemas: dict[str, TargetSchema] = {
        r.qualified_name: target_schema(r, lambda oid: None, True) for r in relations
    }
    with tempfile.TemporaryDirectory(prefix="pgsub-merge-bench-") as root:
        _make(root, schemas, args.rows, columns, vectors=args.vectors)
        merges = LocalMerges()
        writers = _writers(args.processes, root, args.threads, args.rewrite_max_bytes)
        profile = cProfile.Profile()
        for round_ in range(1, args.batches + 1):
            nets = _nets(relations, args.updates, round_)
            last = round_ == args.batches
            started = time.perf_counter()
            if last and args.threads == 1 and not writers:
                profile.enable()
            mark = CommitMark("bench", Lsn(1_000_000 * round_ + 8 * args.tables), 0)

            def merge(name: str, mark: CommitMark = mark, nets: dict[str, KeyedNet] = nets) -> None:
                written = merges.merge(str(Path(root, name)), schemas[name], nets[name], mark)
                assert written is not None and written.updated == args.updates, written

            if writers:
                for number, writer in enumerate(writers):
                    names = list(nets)[number :: len(writers)]
                    writer.send((mark, [(n, schemas[n], nets[n]) for n in names]))
                for writer in writers:
                    writer.recv()
            elif args.threads == 1:
                for name in nets:
                    merge(name)
            else:
                with ThreadPoolExecutor(args.threads) as pool:
                    list(pool.map(merge, nets))
            profile.disable()
            print(f"batch {round_}: {time.perf_counter() - started:.2f} s, {args.tables} tables")
        for writer in writers:
            writer.send(None)
        if args.threads == 1 and not writers:
            pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
