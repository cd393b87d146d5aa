"""The batch applier's per-table progress, with an in-memory stand-in for the Delta tables."""

from __future__ import annotations

from apply.core.batch import Batch, TableFilter
from apply.core.records import WriteResult
from apply.core.transactions import RemoteTransaction
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Relation
from tests.unit.apply.builders import ins, relation, tx
from tests.unit.apply.memory import MemoryTables

T = relation("id", "v")


def test_a_table_handed_over_by_a_sync_worker_is_applied_from_what_it_holds() -> None:
    """The sync worker committed past the leader's cached position: nothing twice."""
    tables = MemoryTables()
    syncing = [False]

    def should_apply(rel: Relation, remote: RemoteTransaction) -> bool:
        return not syncing[0]

    applier = BatchApplier("s", tables, lambda oid: None, applies=TableFilter(should_apply))
    applier.apply(Batch([tx(ins(T, 1, "a"), end=100)]))
    syncing[0] = True  # resync: a sync worker copies the table and catches up to 300
    applier.apply(Batch([tx(ins(T, 2, "b"), end=200)]))
    tables.rows["public.t"] = {b"1": (b"1", b"a"), b"2": (b"2", b"b"), b"3": (b"3", b"c")}
    tables.lsn["public.t"] = Lsn(300)
    syncing[0] = False
    applier.apply(Batch([tx(ins(T, 3, "c"), end=300), tx(ins(T, 4, "d"), end=400)]))
    assert tables.keys() == [1, 2, 3, 4]  # 3 was not inserted again: no insert_exists


def test_progress_is_read_once_per_table_while_the_applier_applies_it() -> None:
    tables = MemoryTables()
    applier = BatchApplier("s", tables, lambda oid: None)
    for end in (100, 200, 300):
        applier.apply(Batch([tx(ins(T, end, "a"), end=end)]))
    assert tables.reads == 1


def test_an_unexpected_failure_keeps_its_table_and_transaction() -> None:
    import pytest

    from apply.batching.error_context import TransactionError

    class Broken(MemoryTables):
        def write(self, *args: object, **kwargs: object) -> WriteResult:
            raise KeyError("a bug")

    applier = BatchApplier("s", Broken(), lambda oid: None)
    with pytest.raises(TransactionError) as err:
        applier.apply(Batch([tx(ins(T, 1, "a"), end=0x1000, xid=731)]))
    message = str(err.value)
    assert "KeyError" in message and 'relation "public.t"' in message
    assert "in transaction 731 finished at 0/FF8" in message


def test_messages_are_written_in_order_once_with_their_transaction() -> None:
    from apply.core.transactions import MessageChange

    tables = MemoryTables()
    applier = BatchApplier("s", tables, lambda oid: None)
    first = tx(ins(T, 1, "a"), MessageChange(Lsn(0x50), True, "app", b"hello"), end=100, xid=701)
    alone = RemoteTransaction(
        0, Lsn(0x90), Lsn(0x90), 0, (MessageChange(Lsn(0x90), False, "x", b"\xff"),)
    )
    applier.apply(Batch([first, alone]))
    assert [
        (m["prefix"], m["transactional"], m["xid"], m["content_text"]) for m in tables.messages
    ] == [
        ("app", True, 701, "hello"),
        ("x", False, None, None),  # not UTF-8: the bytes are in content
    ]
    assert tables.messages[1]["content"] == b"\xff"
    # Resent after a crash: the messages table already has them.
    applier = BatchApplier("s", tables, lambda oid: None)
    applier.apply(Batch([first, alone]))
    assert len(tables.messages) == 2


def test_a_change_log_gets_every_change_once_and_a_mirror_its_net_effect() -> None:
    from tests.unit.apply.builders import upd

    tables = MemoryTables()
    tables.change_logs.add("public.log")
    log = relation("id", "v", name="log")
    batch = Batch(
        [
            tx(ins(log, 1, "a"), upd(log, 1, "b"), ins(T, 1, "a"), end=100),
            tx(upd(log, 1, "c"), upd(T, 1, "c"), end=200),
        ]
    )
    BatchApplier("s", tables, lambda oid: None).apply(batch)
    assert [(r["_pgsub_op"], r["v"]) for r in tables.logged["public.log"]] == [
        ("insert", "a"),
        ("update", "b"),
        ("update", "c"),
    ]
    assert tables.rows["public.t"] == {b"1": (b"1", b"c")}
    # Resent after a crash: the log has it, nothing is appended twice.
    BatchApplier("s", tables, lambda oid: None).apply(batch)
    assert len(tables.logged["public.log"]) == 3


def test_a_column_dropped_and_another_added_at_once_is_logged_as_a_possible_rename() -> None:
    from structlog.testing import capture_logs

    tables = MemoryTables()
    applier = BatchApplier("s", tables, lambda oid: None)
    applier.apply(Batch([tx(ins(T, 1, "a"), end=100)]))
    renamed = relation("id", "w")
    with capture_logs() as logs:
        applier.apply(Batch([tx(ins(renamed, 2, "b"), end=200)]))
        applier.apply(Batch([tx(ins(relation("id", "w", "x"), 3, "c", "d"), end=300)]))
    guesses = [e for e in logs if e["event"].startswith("columns dropped and added at once")]
    assert [(g["dropped"], g["added"]) for g in guesses] == [(["v"], ["w"])]  # x: an add only
