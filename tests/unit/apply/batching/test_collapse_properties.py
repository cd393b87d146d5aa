"""Property: applying a batch's net effect equals applying its changes one by one.

Random DML on a keyed table (inserts, updates with and without key changes,
unchanged-TOAST columns, deletes, truncates) and on a multiset table is cut
into random transactions and batches. The net effect of each batch is
applied with the rules of the MERGE in ``apply.plans.merge_plan`` (matched /
not matched clauses, keep flags, truncate barrier); the result must be the
table the changes give one at a time.
"""

from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from apply.batching.collapse import KeyedNet, MultisetNet, collapse
from apply.core.batch import Batch
from apply.core.transactions import Change, RemoteTransaction
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.messages import UNCHANGED, ReplicaIdentity, TupleData
from tests.unit.apply.builders import dele, ins, relation, row, trunc, upd

KEYED = relation("id", "v", "big")
BAG = relation("a", "b", identity=ReplicaIdentity.FULL, key=())

Table = dict[bytes, tuple[bytes | None, bytes | None]]  # id -> (v, big)


@st.composite
def keyed_history(draw: st.DrawFn) -> tuple[list[Change], Table]:
    """A valid change sequence and the table it leaves (applied one by one)."""
    table: Table = {}
    changes: list[Change] = []
    v: bytes | None
    big: bytes | None
    for _ in range(draw(st.integers(1, 40))):
        keys = sorted(table)
        action = draw(st.sampled_from(["insert", "update", "move", "delete", "truncate"]))
        if action == "truncate" and draw(st.integers(0, 5)) == 0:
            changes.append(trunc(KEYED))
            table.clear()
        elif action == "insert" or not keys:
            key = draw(st.integers(0, 12).map(lambda i: str(i).encode()))
            if key in table:
                continue
            v, big = draw(st.sampled_from([b"a", b"b", None])), draw(st.sampled_from([b"X", b"Y"]))
            table[key] = (v, big)
            changes.append(ins(KEYED, key.decode(), _s(v), _s(big)))
        elif action == "update":
            key = draw(st.sampled_from(keys))
            v = draw(st.sampled_from([b"c", b"d", None]))
            keep_big = draw(st.booleans())
            big = table[key][1] if keep_big else draw(st.sampled_from([b"X", b"Z"]))
            table[key] = (v, big)
            changes.append(upd(KEYED, key.decode(), _s(v), ... if keep_big else _s(big)))
        elif action == "move":
            key = draw(st.sampled_from(keys))
            new = draw(st.integers(13, 30).map(lambda i: str(i).encode()))
            if new in table:
                continue
            v, big = table.pop(key)
            table[new] = (v, big)
            changes.append(upd(KEYED, new.decode(), _s(v), ..., old=(key.decode(), None, None)))
        else:
            key = draw(st.sampled_from(keys))
            del table[key]
            changes.append(dele(KEYED, key.decode(), None, None))
    return changes, table


def _s(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


def _cut(draw: Callable[..., Any], changes: list[Change]) -> list[Batch]:
    """Random transactions, then random batches of them."""
    transactions: list[RemoteTransaction] = []
    position, end = 0, 100
    while position < len(changes):
        size = draw(st.integers(1, 6))
        end += 100
        chunk = tuple(changes[position : position + size])
        transactions.append(RemoteTransaction(1, Lsn(end - 8), Lsn(end), 0, chunk))
        position += size
    batches, position = [], 0
    while position < len(transactions):
        size = draw(st.integers(1, 5))
        batches.append(Batch(transactions[position : position + size]))
        position += size
    return batches


def apply_keyed(table: Table, net: KeyedNet) -> None:
    """The MERGE of ``apply.plans.merge_plan.keyed_merge`` in Python (conflict-free input)."""
    if net.truncated:
        table.clear()
    before = dict(table)  # kept values are read from the target as it was before the MERGE
    for key_tuple, r in net.rows.items():
        key = key_tuple[0]
        assert key is not None
        matched = key in table
        assert matched == r.first.expects_present or net.truncated, "a conflict in valid input"
        if matched and not r.present:
            del table[key]
        elif r.present and r.image is not None:
            moved = before.get(r.toast_key[0]) if r.toast_key and r.toast_key[0] else None
            image = _resolve(r.image, before.get(key), moved)
            if matched or not r.first.expects_present or r.reinserted:
                table[key] = image


def _resolve(
    image: TupleData,
    own: tuple[bytes | None, bytes | None] | None,
    moved: tuple[bytes | None, bytes | None] | None,
) -> tuple[bytes | None, bytes | None]:
    source = moved if moved is not None else own
    values = []
    for i in (1, 2):
        if image.kinds[i] == UNCHANGED:
            assert source is not None, "a kept value with no row to keep it from"
            values.append(source[i - 1])
        else:
            values.append(image.values[i])
    return values[0], values[1]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_keyed_batches_equal_one_by_one(data: st.DataObject) -> None:
    changes, expected = data.draw(keyed_history())
    table: Table = {}
    for batch in _cut(data.draw, changes):
        work = batch.tables(lambda name: ZERO).get("public.t")
        if work is None:
            continue
        net = collapse(work)
        assert isinstance(net, KeyedNet)
        apply_keyed(table, net)
    assert table == expected


@st.composite
def bag_history(draw: st.DrawFn) -> tuple[list[Change], Counter[tuple[str, str]]]:
    bag: Counter[tuple[str, str]] = Counter()
    changes: list[Change] = []
    for _ in range(draw(st.integers(1, 40))):
        present = sorted(bag.elements())
        action = draw(st.sampled_from(["insert", "update", "delete"]))
        if action == "insert" or not present:
            item = (draw(st.sampled_from("123")), draw(st.sampled_from("xy")))
            bag[item] += 1
            changes.append(ins(BAG, *item))
        elif action == "update":
            old = draw(st.sampled_from(present))
            new = (old[0], draw(st.sampled_from("xyz")))
            bag[old] -= 1
            bag[new] += 1
            changes.append(upd(BAG, *new, old=old))
        else:
            old = draw(st.sampled_from(present))
            bag[old] -= 1
            changes.append(dele(BAG, *old))
    return changes, +bag


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_multiset_batches_equal_one_by_one(data: st.DataObject) -> None:
    changes, expected = data.draw(bag_history())
    bag: Counter[TupleData] = Counter()
    for batch in _cut(data.draw, changes):
        net = collapse(batch.tables(lambda name: ZERO)["public.t"])
        assert isinstance(net, MultisetNet)
        for image, r in net.rows.items():
            bag[image] += r.delta
            assert bag[image] >= 0, "a removal of a row that is not there"
    assert +bag == Counter({row(a, b): n for (a, b), n in expected.items()})
