"""Binary values pgsub has no reader for, turned into the publisher's text forms (``binary: true``).

With ``binary: true`` pgoutput sends every value of a type with a send
function in that type's binary form. pgsub reads the common ones itself
(``apply.columns.binary``); PostgreSQL's subscriber reads the rest with the type's
receive function, which it has because the type exists on the subscriber. The
one place every type of a publisher's table exists for certain - extension
types, composites, ranges, money in the publisher's ``lc_monetary``, the
geometric types - is the publisher: so a value of such a type is sent back to
it as a parameter of that type in binary format, and its output function gives
the text form that text mode would have carried (same session settings:
``subscriber.replication.session``). The column then holds exactly what text
mode writes. Each distinct value is rendered once per table per batch.

Pure: the round trip is the ``TextForms`` seam (``PublisherCatalog.text_forms``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from apply.core.batch import TableChange, TableWork
from apply.core.transactions import RowChange
from subscriber.replication.messages import BINARY, TEXT, Column, TupleData

# (type OID as pgoutput names it, binary-format values) -> each value's text output.
TextForms = Callable[[int, Sequence[bytes]], Sequence[str]]
# Whether pgsub reads this column's binary form itself.
Readable = Callable[[Column], bool]


def in_text_form(work: TableWork, readable: Readable, text_forms: TextForms) -> TableWork:
    """``work`` with every binary value of a column ``readable`` declines as its text form."""
    wanted: dict[int, dict[bytes, bytes]] = {}
    unread: dict[int, list[int]] = {}  # per layout (its id), the columns to render
    for image, columns in _images(work):
        layout = id(columns)
        if layout not in unread:
            unread[layout] = [i for i, c in enumerate(columns) if not readable(c)]
        for i in unread[layout]:
            value = image.values[i] if i < len(image.kinds) else None
            if value is not None and image.kinds[i] == BINARY:
                wanted.setdefault(columns[i].type_oid, {})[value] = b""
    if not wanted:
        return work
    for type_oid, values in wanted.items():
        sent = list(values)
        texts = text_forms(type_oid, sent)
        for value, text in zip(sent, texts, strict=True):
            values[value] = text.encode()
    changes = [_rendered(entry, wanted) for entry in work.changes]
    return TableWork(work.relation, changes)


def _images(work: TableWork) -> list[tuple[TupleData, tuple[Column, ...]]]:
    found = []
    for entry in work.changes:
        change = entry.change
        if isinstance(change, RowChange):
            for image in (change.new, change.old):
                if image is not None and BINARY in image.kinds:
                    found.append((image, change.relation.columns))
    return found


def _rendered(entry: TableChange, wanted: dict[int, dict[bytes, bytes]]) -> TableChange:
    change = entry.change
    if not isinstance(change, RowChange):
        return entry
    columns = change.relation.columns
    new = _image(change.new, columns, wanted)
    old = _image(change.old, columns, wanted)
    if new is change.new and old is change.old:
        return entry
    return TableChange(entry.tx, replace(change, new=new, old=old), entry.position)


def _image(
    image: TupleData | None, columns: tuple[Column, ...], wanted: dict[int, dict[bytes, bytes]]
) -> TupleData | None:
    if image is None or BINARY not in image.kinds:
        return image
    kinds = bytearray(image.kinds)
    values = list(image.values)
    for i, column in enumerate(columns[: len(kinds)]):
        texts = wanted.get(column.type_oid)
        value = values[i]
        if kinds[i] == BINARY and texts is not None and value is not None and value in texts:
            kinds[i] = TEXT
            values[i] = texts[value]
    if kinds == image.kinds:
        return image
    return TupleData(bytes(kinds), tuple(values))
