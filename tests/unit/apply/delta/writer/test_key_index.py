"""The key index of pgsub's deletion-vector write (apply/delta/writer/vector_write.py): which keys
it
can look up, and a composite key's one string a row, equal exactly when every column is."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

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


def _file(name: str) -> VectorFile:
    return VectorFile(name, name, 1, 0, None, None)


@settings(max_examples=60, deadline=None)
@given(
    files=st.lists(st.lists(st.integers(-50, 50), max_size=40), min_size=1, max_size=4),
    wanted=st.lists(st.integers(-60, 60), max_size=30, unique=True),  # a batch: one row a key
)
def test_a_batchs_integer_keys_are_found_in_any_order_as_each_file_holds_them(
    files: list[list[int]], wanted: list[int]
) -> None:
    """The rows holding a key of the batch, by file in row order, whatever order the batch's
    keys come in (they are looked up sorted) and though a file holds a key twice."""
    fields = lookup_keys(TYPES, ("id",))
    assert fields is not None
    index = KeyIndex(LocalStore("unused"), fields)
    live = [_file(f"part-{n}") for n in range(len(files))]
    for file, keys in zip(live, files, strict=True):
        index.added(file.name, pa.table({"id": pa.array(keys, pa.int64())}))
    matches, found = index.find(live, pa.array(wanted, pa.int64()))
    looked_for = set(wanted)
    expected = {
        file.name: [row for row, key in enumerate(keys) if key in looked_for]
        for file, keys in zip(live, files, strict=True)
    }
    got = {match.file.name: match.positions.tolist() for match in matches}
    assert got == {name: rows for name, rows in expected.items() if rows}
    keys_by_file = dict(zip([f.name for f in live], files, strict=True))
    assert found.to_pylist() == [
        keys_by_file[match.file.name][row] for match in matches for row in match.positions
    ]
