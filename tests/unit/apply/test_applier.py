"""The batch applier's per-table progress, with an in-memory stand-in for the Delta tables."""

from __future__ import annotations

from collections.abc import Mapping

from apply.applier import BatchApplier
from apply.batch import Batch
from apply.collapse import KeyedNet, Net
from apply.records import CommitMark, Within, WriteResult
from apply.schema import Evolution, TargetSchema
from apply.transactions import RemoteTransaction
from conflicts.kinds import ConflictKind, Resolution
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import Relation
from tests.unit.apply.builders import ins, relation, tx

T = relation("id", "v")


class MemoryTables:
    """Each table's committed LSN and the keys written, as a Delta table's history holds them."""

    def __init__(self) -> None:
        self.lsn: dict[str, Lsn] = {}
        self.rows: dict[str, list[bytes | None]] = {}
        self.reads = 0

    def applied_lsn(self, table: str) -> Lsn:
        self.reads += 1
        return self.lsn.get(table, ZERO)

    def applied_within(self, table: str) -> Within | None:
        return None

    def prepare(self, schema: TargetSchema) -> Evolution | None:
        return None

    def write(
        self,
        schema: TargetSchema,
        net: Net,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution] = {},
    ) -> WriteResult:
        assert isinstance(net, KeyedNet)
        self.rows.setdefault(schema.table, []).extend(key[0] for key in net.rows)
        self.lsn[schema.table] = mark.lsn
        return WriteResult(schema.table, len(self.rows[schema.table]))


def test_a_table_handed_over_by_a_sync_worker_is_applied_from_what_it_holds() -> None:
    """The sync worker committed past the leader's cached position: nothing twice."""
    tables = MemoryTables()
    syncing = [False]

    def should_apply(rel: Relation, remote: RemoteTransaction) -> bool:
        return not syncing[0]

    applier = BatchApplier("s", tables, lambda oid: None, should_apply=should_apply)
    applier.apply(Batch([tx(ins(T, 1, "a"), end=100)]))
    syncing[0] = True  # resync: a sync worker copies the table and catches up to 300
    applier.apply(Batch([tx(ins(T, 2, "b"), end=200)]))
    tables.rows["public.t"] = [b"1", b"2", b"3"]
    tables.lsn["public.t"] = Lsn(300)
    syncing[0] = False
    applier.apply(Batch([tx(ins(T, 3, "c"), end=300), tx(ins(T, 4, "d"), end=400)]))
    assert tables.rows["public.t"] == [b"1", b"2", b"3", b"4"]


def test_progress_is_read_once_per_table_while_the_applier_applies_it() -> None:
    tables = MemoryTables()
    applier = BatchApplier("s", tables, lambda oid: None)
    for end in (100, 200, 300):
        applier.apply(Batch([tx(ins(T, end, "a"), end=end)]))
    assert tables.reads == 1


def test_an_unexpected_failure_keeps_its_table_and_transaction() -> None:
    import pytest

    from apply.applier import TransactionError

    class Broken(MemoryTables):
        def write(self, *args: object, **kwargs: object) -> WriteResult:
            raise KeyError("a bug")

    applier = BatchApplier("s", Broken(), lambda oid: None)
    with pytest.raises(TransactionError) as err:
        applier.apply(Batch([tx(ins(T, 1, "a"), end=0x1000, xid=731)]))
    message = str(err.value)
    assert "KeyError" in message and 'relation "public.t"' in message
    assert "in transaction 731 finished at 0/FF8" in message
