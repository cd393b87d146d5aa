"""The key index of pgsub's deletion-vector write (apply/delta/writer/vector_write.py): which keys
it
can look up, and a composite key's one string a row, equal exactly when every column is."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from unittest.mock import patch

import numpy as np
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from apply.delta.files.local_store import LocalStore
from apply.delta.writer.key_index import KeyIndex, lookup_keys
from apply.delta.writer.live_files import VectorFile

TYPES = pa.schema(
    [
        ("id", pa.int64()),
        ("code", pa.string()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("amount", pa.decimal128(12, 2)),
        ("flag", pa.bool_()),
        ("ratio", pa.float64()),
        ("blob", pa.binary()),
        ("v", pa.string()),
    ]
)


def test_which_keys_the_index_can_look_up() -> None:
    assert lookup_keys(TYPES, ("ratio",)) == pa.schema([("ratio", pa.float64())])  # one column
    several = ("id", "code", "day", "at", "amount", "flag")
    assert lookup_keys(TYPES, several) == pa.schema([TYPES.field(n) for n in several])
    assert lookup_keys(TYPES, ("id", "ratio")) is None  # -0.0 and 0.0 are one key
    assert lookup_keys(TYPES, ("id", "blob")) is None  # bytes may hold the separator


# Text as PostgreSQL holds it: any character but NUL.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)
KEYS = st.tuples(
    st.integers(-(2**63), 2**63 - 1),
    TEXT,
    st.dates(),
    st.datetimes(timezones=st.just(dt.UTC)),
    st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False),
    st.booleans(),
)


SAME = (dt.date(2026, 1, 1), dt.datetime(2026, 1, 1, tzinfo=dt.UTC), Decimal("1.50"), True)


@settings(max_examples=150, deadline=None)
@given(st.lists(KEYS, min_size=1, max_size=30))
@example([(1, "2x", *SAME), (12, "x", *SAME)])  # apart, though concatenated they are one
def test_a_composite_keys_string_is_equal_exactly_when_every_column_is(
    keys: list[tuple[int, str, dt.date, dt.datetime, Decimal, bool]],
) -> None:
    names = ["id", "code", "day", "at", "amount", "flag"]
    fields = lookup_keys(TYPES, tuple(names))
    assert fields is not None
    rows = pa.table(
        {
            name: pa.array([key[i] for key in keys], type=fields.field(name).type)
            for i, name in enumerate(names)
        }
    )
    joined = KeyIndex(LocalStore("unused"), fields).key_of(rows).to_pylist()
    by_key: dict[tuple[object, ...], str] = {}
    for key, text in zip(keys, joined, strict=True):
        assert by_key.setdefault(key, text) == text  # equal keys: one string
    assert len(set(by_key.values())) == len(by_key)  # different keys: different strings


def test_a_one_column_key_is_the_column_itself() -> None:
    fields = lookup_keys(TYPES, ("id",))
    assert fields is not None
    rows = pa.table({"id": pa.array([3, 1], pa.int32()), "v": ["a", "b"]})
    assert KeyIndex(LocalStore("unused"), fields).key_of(rows).equals(pa.array([3, 1], pa.int64()))


# A table's history of files: each step adds a file of these keys, or removes the file at
# this index of those live, or deletes the alive row at this index of a file.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(-40, 40), max_size=12)),
        st.tuples(st.just("remove"), st.integers(0, 50)),
        st.tuples(st.just("delete"), st.integers(0, 50), st.integers(0, 50)),
        st.tuples(st.just("find"), st.lists(st.integers(-45, 45), min_size=1, max_size=8)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(STEPS, st.booleans())
def test_small_files_looked_up_together_find_what_each_file_holds(
    steps: list[tuple[object, ...]], large: bool
) -> None:
    """The small files are found through one sorted array, made again as files come and
    go; each find answers what a search of every live file's alive rows answers, in the
    files' order (``large``: a first file too large to be put together)."""
    from apply.delta.writer import key_index

    with patch.object(key_index, "APART_AT_MOST", 2):  # put together from three small files
        _replay(steps, large)


def test_small_files_are_searched_together_once_there_are_enough() -> None:
    """Twenty small files: one array holds them, and a find answers from it."""

    steps: list[tuple[object, ...]] = [("add", [i, i + 100]) for i in range(20)]
    index = _replay([*steps, ("find", [3, 104, 7])], large=False)
    assert index._together is not None and len(index._together.names) == 20


def _replay(steps: list[tuple[object, ...]], large: bool) -> KeyIndex:
    from apply.delta.writer import key_index

    index = KeyIndex(LocalStore("unused"), pa.schema([("id", pa.int64())]))
    live: dict[str, tuple[list[int], list[bool]]] = {}  # each file's keys and alive rows
    made = 0

    def add(keys: list[int]) -> None:
        nonlocal made
        made += 1
        name = f"f{made}"
        index.added(name, pa.table({"id": pa.array(keys, pa.int64())}))
        live[name] = (keys, [True] * len(keys))

    if large:
        add(list(range(-20, key_index.TOGETHER_ROWS - 19)))
    for step in steps:
        names = list(live)
        if step[0] == "add":
            add(list(step[1]))  # type: ignore[call-overload]
        elif step[0] == "remove" and names:
            del live[names[int(step[1]) % len(names)]]  # type: ignore[call-overload]
        elif step[0] == "delete" and names:
            name = names[int(step[1]) % len(names)]  # type: ignore[call-overload]
            alive = [i for i, up in enumerate(live[name][1]) if up]
            if alive:
                row = alive[int(step[2]) % len(alive)]  # type: ignore[call-overload]
                live[name][1][row] = False
                index.committed(name, np.array([row]), f"v{made}-{row}")
        elif step[0] == "find":
            wanted = set(step[1])  # type: ignore[call-overload]
            files = [_file(name) for name in live]
            matches, found = index.find(files, pa.array(sorted(wanted), pa.int64()))
            expected = [
                (name, [i for i, k in enumerate(keys) if k in wanted and alive[i]])
                for name, (keys, alive) in live.items()
            ]
            expected = [(name, rows) for name, rows in expected if rows]
            got = [(m.file.name, m.positions.tolist()) for m in matches]
            assert got == expected
            keys = [live[name][0][i] for name, rows in expected for i in rows]
            assert found.to_pylist() == keys
    return index


def _file(name: str) -> VectorFile:
    return VectorFile(name, name, 1, 0, None, None)
