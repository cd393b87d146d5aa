"""A batch's own Python work before its writes, at its turn and as it forms (no servers).

N single-row UPDATE transactions of pgbench's accounts table (random keys of
a 1M-row table), as the steady-load benchmarks send them. For each batch size
it prints the median seconds, over ``--rounds``, of:

- at the turn (as before ``apply.batching.forming``): the split by table
  (``Batch.tables``) and the collapse (``apply.batching.collapse``);
- as it forms: ``Forming.add`` of every transaction (done while the batch
  before is written) and ``Forming.take`` (left at the turn);
- the MERGE source (``apply.batching.source.keyed_source``), built at the turn either way.

The figures behind docs/performance.md, "Formed while the last batch is written".

    python -m benchmarks.batch_work --changes 3000,10000,100000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from apply.batching.collapse import KeyedNet, collapse
from apply.batching.forming import Forming
from apply.batching.source import keyed_source
from apply.columns.schema import target_schema
from apply.core.batch import Batch
from apply.core.transactions import Op, RemoteTransaction, RowChange, change_size
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import TEXT, Column, Relation, ReplicaIdentity, TupleData

ACCOUNTS = Relation(
    16384,
    "public",
    "pgbench_accounts",
    ReplicaIdentity.DEFAULT,
    (
        Column("aid", 23, -1, True),
        Column("bid", 23, -1, False),
        Column("abalance", 23, -1, False),
        Column("filler", 1042, 88, False),
    ),
)


class ReadyView:
    """The applier's answers in the steady state: every table written before, unchanged."""

    def applies(self, relation: Relation, tx: RemoteTransaction) -> bool:
        return True

    def known_applied_lsn(self, table: str) -> Lsn | None:
        return ZERO

    def formable(self, relation: Relation) -> bool | None:
        return True

    def table_states(self) -> object:
        return None


def _transactions(count: int, rows: int) -> list[RemoteTransaction]:
    draw = random.Random(count)  # noqa: S311 - a benchmark's keys, not a secret
    found = []
    for i in range(count):
        aid = draw.randint(1, rows)
        balance = draw.randint(-5000, 5000)
        values = (str(aid).encode(), b"1", str(balance).encode(), b" " * 84)
        change = RowChange(ACCOUNTS, Op.UPDATE, TupleData(bytes([TEXT]) * 4, values), None)
        end = 1000 + 16 * i
        tx = RemoteTransaction(i, Lsn(end - 8), Lsn(end), 0, (change,), size=change_size(change))
        found.append(tx)
    return found


def _median(rounds: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _formed(batch: Batch) -> Forming:
    forming = Forming(ReadyView())
    for tx in batch.transactions:
        forming.add(tx)
    return forming


def _take_seconds(rounds: int, batch: Batch) -> float:
    times = []
    for _ in range(rounds):
        forming = _formed(batch)
        started = time.perf_counter()
        forming.take(batch)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _row(count: int, rows: int, rounds: int) -> str:
    schema = target_schema(ACCOUNTS, lambda oid: None, True)
    name = ACCOUNTS.qualified_name
    batch = Batch(_transactions(count, rows))

    def at_turn() -> object:
        return collapse(batch.tables(lambda table: ZERO)[name])

    net = collapse(batch.tables(lambda table: ZERO)[name])
    assert isinstance(net, KeyedNet)
    turn = _median(rounds, at_turn)
    adding = _median(rounds, lambda: _formed(batch))
    taking = _take_seconds(rounds, batch)
    source = _median(rounds, lambda: keyed_source(net, schema))
    return f"| {count:,} | {turn:.3f} s | {adding:.3f} s | {taking:.3f} s | {source:.3f} s |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", default="3000,10000,100000")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| changes | split + collapse at the turn | forming: add | forming: take | source |")
    print("|---|---|---|---|---|")
    for count in (int(c) for c in args.changes.split(",")):
        print(_row(count, args.rows, args.rounds))


if __name__ == "__main__":
    main()
