"""``apply.schema_changes.ddl``: the event triggers' messages read, paired and diffed by attribute
number,
and the applier following a change at its LSN (the batch split there)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apply.arrival.assembly import TransactionAssembler
from apply.core.batch import Batch, TableFilter
from apply.core.transactions import MessageChange
from apply.schema_changes.ddl import (
    DDL_PREFIX,
    DdlMessageError,
    diff,
    new_columns,
    parse,
    renamed_work,
    schema_changes,
)
from apply.worker.applier import BatchApplier
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Begin, Commit, LogicalMessage
from tests.unit.apply.builders import ins, relation, tx, upd
from tests.unit.apply.memory import MemoryTables


def shape(event: str, *columns: tuple[int, str, str], relid: int = 16384) -> bytes:
    return json.dumps(
        {
            "version": 1,
            "event": event,
            "tag": "ALTER TABLE",
            "relid": str(relid),
            "schema": "public",
            "table": "t",
            "columns": [
                {"attnum": n, "name": name, "type": kind, "type_oid": "25", "typmod": -1}
                for n, name, kind in columns
            ],
        }
    ).encode()


def message(content: bytes, lsn: int = 0x60, prefix: str = DDL_PREFIX) -> MessageChange:
    return MessageChange(Lsn(lsn), True, prefix, content)


BEFORE = shape("before", (1, "id", "integer"), (2, "v", "text"), (3, "b", "integer"))
AFTER = shape("after", (1, "id", "bigint"), (2, "w", "text"), (4, "c", "text"))


def test_a_pair_of_messages_says_what_changed_by_attribute_number() -> None:
    change = diff(parse(BEFORE).shape, parse(AFTER).shape, Lsn(0x60))
    assert change.table == "public.t" and change.relid == 16384
    assert change.renamed == (("v", "w"),)
    assert change.dropped == ("b",) and change.added == ("c",)
    assert change.retyped == (("id", "integer", "bigint"),)


def test_messages_pair_within_a_transaction_and_a_lone_one_is_left_out() -> None:
    other = shape("before", (1, "x", "text"), relid=99)  # named by the text, not altered
    alone = shape("after", (1, "x", "text"), relid=98)  # no before: renames unknown
    same = shape("after", (1, "id", "integer"), (2, "v", "text"), (3, "b", "integer"))
    found = schema_changes(
        tx(
            message(other),
            message(BEFORE),
            message(b"{}", prefix="app"),  # someone else's
            message(AFTER, lsn=0x70),
            message(alone),
            message(BEFORE),
            message(same),  # nothing changed: no change
        )
    )
    assert [(c.relid, c.lsn, c.renamed) for c in found] == [(16384, Lsn(0x70), (("v", "w"),))]


def test_a_message_of_another_version_or_shape_is_refused_with_the_way_out() -> None:
    with pytest.raises(DdlMessageError, match="publisher-setup"):
        parse(json.dumps({"version": 2}).encode())
    with pytest.raises(DdlMessageError, match="cannot read"):
        parse(b"not json")


def test_images_sent_before_a_rename_are_read_under_the_new_names() -> None:
    old, new = relation("id", "v"), relation("id", "w")
    batch = Batch([tx(upd(old, 1, "before"), message(BEFORE), message(AFTER), upd(new, 2, "x"))])
    work = batch.tables(lambda name: Lsn(0))["public.t"]
    change = schema_changes(batch.transactions[0])[0]
    renamed = renamed_work(work, change)
    assert [[c.name for c in e.change.relation.columns] for e in renamed.changes] == [  # type: ignore[union-attr]
        ["id", "w"],
        ["id", "w"],
    ]


def test_the_applier_follows_a_change_at_its_lsn_splitting_the_batch() -> None:
    old, new = relation("id", "v"), relation("id", "w")
    tables = MemoryTables()
    applier = BatchApplier("s", tables, lambda oid: None, messages=False)
    batch = Batch(
        [
            tx(ins(old, 1, "a"), end=100),
            tx(message(BEFORE), message(AFTER), upd(new, 1, "b"), end=200),
            tx(ins(new, 2, "c"), end=300),
        ]
    )
    result = applier.apply(batch)
    assert [(table, int(mark.lsn)) for table, mark in tables.commits] == [
        ("public.t", 100),  # before the change: committed first
        ("public.t", 300),
    ]  # and no messages table: messages: false
    assert [(int(c.lsn), c.renamed) for c in tables.followed] == [(0x60, (("v", "w"),))]
    assert result.end_lsn == Lsn(300)
    assert tables.rows["public.t"] == {b"1": (b"1", b"b"), b"2": (b"2", b"c")}
    # Applied again (a crash before the flush was confirmed): the table has it.
    BatchApplier("s", tables, lambda oid: None, messages=False).apply(batch)
    assert len(tables.followed) == 1


def test_a_table_another_worker_applies_is_not_followed_here() -> None:
    tables = MemoryTables()
    applier = BatchApplier(
        "s", tables, lambda oid: None, applies=TableFilter(lambda rel, tx: False)
    )
    applier.apply(
        Batch([tx(ins(relation("id", "v"), 1, "a")), tx(message(BEFORE), message(AFTER))])
    )
    assert tables.followed == []


def test_without_messages_the_assembler_keeps_only_pgsub_ddl_messages() -> None:
    kept: list[Any] = []
    for messages in (False, True):
        assembler = TransactionAssembler(messages=messages)
        assembler.feed(Begin(Lsn(0x80), 0, 7))
        assembler.feed(LogicalMessage(True, Lsn(0x50), "app", b"x", 7))
        assembler.feed(LogicalMessage(True, Lsn(0x60), DDL_PREFIX, BEFORE, 7))
        done = assembler.feed(Commit(0, Lsn(0x80), Lsn(0x88), 0))
        assert done is not None
        kept.append([c.prefix for c in done.changes])  # type: ignore[union-attr]
    assert kept == [[DDL_PREFIX], ["app", DDL_PREFIX]]


def test_a_default_every_row_took_is_read_from_its_array_literal() -> None:
    from apply.schema_changes.ddl import ShapeColumn

    def column(missing: str | None, has_default: bool = True) -> ShapeColumn:
        return ShapeColumn(4, "c", "text", 25, -1, has_default, missing)

    assert column("{5}").missing_value() == "5"
    assert column('{"a \\"b\\" \\\\ c"}').missing_value() == 'a "b" \\ c'
    assert column("{NULL}").missing_value() is None
    assert column(None).missing_value() is None
    after = parse(
        json.dumps(
            {
                "version": 1,
                "event": "after",
                "tag": "ALTER TABLE",
                "relid": "1",
                "schema": "public",
                "table": "t",
                "columns": [
                    {"attnum": 1, "name": "id", "type": "integer", "type_oid": 23, "typmod": -1},
                    {
                        "attnum": 2,
                        "name": "n",
                        "type": "integer",
                        "type_oid": 23,
                        "typmod": -1,
                        "has_default": True,
                        "missing": "{7}",
                    },
                    {
                        "attnum": 3,
                        "name": "at",
                        "type": "timestamptz",
                        "type_oid": 1184,
                        "typmod": -1,
                        "has_default": True,
                    },
                ],
            }
        ).encode()
    ).shape
    before = parse(shape("before", (1, "id", "integer"))).shape
    change = diff(before, after, Lsn(0x60))
    assert [(c.name, c.missing_value()) for c in change.filled()] == [("n", "7"), ("at", None)]
    columns = new_columns(change, lambda oid: None)
    assert columns.fills == {"n": 7}  # as the column's type
    assert columns.unknown == ("at",)  # computed row by row: never sent
    assert columns.types["n"] == "int"
