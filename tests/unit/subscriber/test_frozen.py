"""``quick``: a frozen message's ``__init__`` through its slots' setters, as dataclasses'
own would make it - the same parameters, the same values, still frozen."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest

from apply.arrival.queue import Queued
from apply.core.batch import TableChange
from apply.core.transactions import Op, RemoteTransaction, RowChange
from subscriber.replication.frozen import quick
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import (
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    Relation,
    ReplicaIdentity,
    TupleData,
    Update,
)
from subscriber.replication.runs import WholeTransaction

QUICK = [
    TupleData,
    Begin,
    Commit,
    Insert,
    Update,
    Delete,
    WholeTransaction,
    RowChange,
    RemoteTransaction,
    Queued,
    TableChange,
]

IMAGE = TupleData(b"t", (b"1",))
RELATION = Relation(
    16384, "public", "t", ReplicaIdentity.DEFAULT, (Column("id", 23, -1, is_key=True),)
)
SAMPLE: dict[str, Any] = {  # a distinct value a field name, whatever its class
    "kinds": b"tn",
    "values": (b"7", None),
    "final_lsn": Lsn(0x10),
    "commit_time": 12,
    "begin_time": 11,
    "xid": 741,
    "flags": 0,
    "commit_lsn": Lsn(0x10),
    "end_lsn": Lsn(0x18),
    "relation_oid": 16384,
    "new": IMAGE,
    "old": TupleData(b"t", (b"2",)),
    "old_is_key": True,
    "begin": Begin(Lsn(0x10), 12, 741),
    "changes": (Insert(16384, IMAGE),),
    "commit": Commit(0, Lsn(0x10), Lsn(0x18), 12),
    "relation": RELATION,
    "op": Op.UPDATE,
    "origin": "node_a",
    "origin_lsn": Lsn(0x5),
    "first": 3,
    "total": 9,
    "size": 40,
    "tx": 4,
    "arrived": 1.5,
    "change": RowChange(RELATION, Op.INSERT, IMAGE, None),
    "position": 6,
}


@pytest.mark.parametrize("cls", QUICK, ids=lambda cls: cls.__name__)
def test_a_quick_message_takes_what_its_dataclass_init_takes(cls: type) -> None:
    """Each field a parameter in order, with its default - what ``dataclass`` makes."""
    fields = dataclasses.fields(cls)
    parameters = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, f in zip(parameters, fields, strict=True):
        assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert parameter.default is default, f.name


@pytest.mark.parametrize("cls", QUICK, ids=lambda cls: cls.__name__)
def test_a_quick_message_holds_what_it_was_given_and_stays_frozen(cls: type) -> None:
    fields = dataclasses.fields(cls)
    values = [SAMPLE[f.name] for f in fields]
    by_position, by_name = cls(*values), cls(**{f.name: SAMPLE[f.name] for f in fields})
    for message in (by_position, by_name):
        assert [getattr(message, f.name) for f in fields] == values
    assert by_position == by_name and hash(by_position) == hash(by_name)
    assert pickle.loads(pickle.dumps(by_position)) == by_position
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(by_position, fields[0].name, values[0])
    required = [SAMPLE[f.name] for f in fields if f.default is dataclasses.MISSING]
    defaulted = cls(*required)  # each default given, as dataclasses gives it
    for f in fields:
        if f.default is not dataclasses.MISSING:
            assert getattr(defaulted, f.name) == f.default, f.name


def test_a_replaced_transaction_is_a_new_one_with_the_fields_named() -> None:
    tx = RemoteTransaction(741, Lsn(0x10), Lsn(0x18), 12, (), size=5)
    assert dataclasses.replace(tx, size=0, changes=()) == RemoteTransaction(
        741, Lsn(0x10), Lsn(0x18), 12, ()
    )


def test_quick_refuses_what_it_could_not_make_as_dataclasses_would() -> None:
    """Anything its ``__init__`` would make differently is refused when the class is made."""

    @dataclass(slots=True)
    class Unfrozen:
        a: int

    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        a: int

    @dataclass(frozen=True, slots=True)
    class Derived:
        a: int
        b: int = field(default=0, init=False)

    @dataclass(frozen=True, slots=True)
    class Passed:
        a: int
        b: InitVar[int]

    for cls in (Unfrozen, Unslotted, Checked, Factory, KeywordOnly, Derived, Passed, int):
        with pytest.raises(TypeError):
            quick(cls)
