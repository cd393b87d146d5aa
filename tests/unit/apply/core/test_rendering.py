"""Binary values pgsub has no reader for, as the publisher's text forms (apply.core.rendering)."""

from __future__ import annotations

from collections.abc import Sequence

from apply.core.batch import TableChange, TableWork
from apply.core.rendering import in_text_form
from apply.core.transactions import Op, RowChange
from subscriber.replication.messages import (
    BINARY,
    NULL,
    TEXT,
    UNCHANGED,
    Column,
    Relation,
    ReplicaIdentity,
    TupleData,
)

INET = 869
REL = Relation(
    1,
    "public",
    "t",
    ReplicaIdentity.DEFAULT,
    (Column("id", 23, -1, True), Column("ip", INET, -1, False), Column("note", 25, -1, False)),
)


def image(*cells: tuple[int, bytes | None]) -> TupleData:
    return TupleData(bytes(kind for kind, _ in cells), tuple(value for _, value in cells))


class Publisher:
    """Stands in for the publisher's output functions; counts what it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, list[bytes]]] = []

    def text_forms(self, type_oid: int, values: Sequence[bytes]) -> list[str]:
        self.sent.append((type_oid, list(values)))
        return [f"text of {value.hex()}" for value in values]


def reads(column: Column) -> bool:
    return column.type_oid != INET


def test_values_of_an_unread_type_become_text_once_each_and_others_stay() -> None:
    key = (BINARY, b"\x00\x00\x00\x01")
    insert = RowChange(REL, Op.INSERT, image(key, (BINARY, b"\x02"), (BINARY, b"n")), None)
    update = RowChange(
        REL,
        Op.UPDATE,
        image(key, (BINARY, b"\x03"), (UNCHANGED, None)),
        image(key, (BINARY, b"\x02"), (NULL, None)),
    )
    text = RowChange(REL, Op.INSERT, image((TEXT, b"2"), (TEXT, b"1.2.3.4"), (NULL, None)), None)
    work = TableWork(REL, [TableChange(0, insert), TableChange(1, update), TableChange(1, text)])
    publisher = Publisher()
    rendered = in_text_form(work, reads, publisher.text_forms)
    assert publisher.sent == [(INET, [b"\x02", b"\x03"])]  # each distinct value once
    first, second, third = (entry.change for entry in rendered.changes)
    assert isinstance(first, RowChange) and isinstance(second, RowChange)
    assert first.new == image(key, (TEXT, b"text of 02"), (BINARY, b"n"))
    assert second.new == image(key, (TEXT, b"text of 03"), (UNCHANGED, None))
    assert second.old == image(key, (TEXT, b"text of 02"), (NULL, None))
    assert third is text  # nothing binary: the same change


def test_a_batch_without_unread_binary_values_asks_nothing() -> None:
    change = RowChange(REL, Op.INSERT, image((BINARY, b"1"), (NULL, None), (BINARY, b"x")), None)
    work = TableWork(REL, [TableChange(0, change)])
    publisher = Publisher()
    assert in_text_form(work, reads, publisher.text_forms) is work
    assert publisher.sent == []


def test_an_image_of_an_older_layout_is_read_with_its_own_columns() -> None:
    """A column added mid-batch: an earlier image has fewer values than the latest layout."""
    older = Relation(1, "public", "t", ReplicaIdentity.DEFAULT, REL.columns[:2])
    change = RowChange(older, Op.INSERT, image((BINARY, b"1"), (BINARY, b"\x07")), None)
    work = TableWork(REL, [TableChange(0, change)])
    rendered = in_text_form(work, reads, Publisher().text_forms)
    new = rendered.changes[0].change
    assert isinstance(new, RowChange)
    assert new.new == image((BINARY, b"1"), (TEXT, b"text of 07"))
