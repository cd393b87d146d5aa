"""``binary: true`` for every built-in type PostgreSQL's subscriber can receive, on every major.

The same table is replicated twice from one publisher, by a text-mode and a
binary-mode subscription into two warehouses, through inserts, updates and
deletes; the two Delta tables must hold the same columns and the same
values, read back by delta-rs (a reader that is not Spark). Types pgsub reads
itself in binary and types whose text form the publisher renders
(``apply.core.rendering``) are both here, with arrays of each, NULL elements and
PostgreSQL's own edge values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deltalake
import pytest

from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration

# (column, type, values as SQL literals): one row per value; NULL is a value.
COLUMNS: list[tuple[str, str, list[str]]] = [
    (
        "ip",
        "inet",
        [
            "'192.168.0.1'",
            "'10.1.0.0/16'",
            "'::1'",
            "'2001:db8::ff00:42:8329/64'",
            "'::ffff:1.2.3.4'",
            "'::'",
            "'1::'",
            "'0.0.0.0/0'",
            "'fe80::1:0:0:0:1'",
        ],
    ),
    (
        "net",
        "cidr",
        ["'10.0.0.0/8'", "'2001:db8::/32'", "'0.0.0.0/0'", "'::/0'", "'192.168.1.0/24'"],
    ),
    ("mac", "macaddr", ["'08:00:2b:01:02:03'", "'ff:ff:ff:ff:ff:ff'", "'00:00:00:00:00:00'"]),
    ("mac8", "macaddr8", ["'08:00:2b:01:02:03:04:05'", "'08:00:2b:01:02:03'"]),
    (
        "cash",
        "money",
        ["'12.34'", "'-1234567.89'", "'0'", "'-92233720368547758.08'", "'92233720368547758.07'"],
    ),
    ("bits", "bit(5)", ["B'10101'", "B'00000'", "B'11111'"]),
    ("vbits", "varbit", ["B''", "B'1'", "B'101010101'", "B'1111111100000000'"]),
    ("o", "oid", ["0", "4294967295", "16384"]),
    ("x", "xid", ["'0'", "'4294967295'", "'3'"]),
    ("x8", "xid8", ["'0'", "'18446744073709551615'", "'42'"]),
    ("lsn", "pg_lsn", ["'0/0'", "'FFFFFFFF/FFFFFFFF'", "'16/B374D848'"]),
    ("doc", "xml", ["'<a b=\"1\">x &amp; y</a>'", "'<?xml version=\"1.0\"?><r/>'", "'text'"]),
    ("tsv", "tsvector", ["'a fat cat'", "$$'it''s':1A,2B 'x\\\\y':3C,4$$", "''"]),
    ("tsq", "tsquery", ["'fat & (rat | cat)'", "'!a <-> b:*'", "'a <3> (b | !c:AB)'"]),
    ("pt", "point", ["'(1,2)'", "'(-0.5,1e300)'", "'(NaN,Infinity)'", "'(0.1,-0)'"]),
    ("ln", "line", ["'{1,-1,0}'", "'{0,1,2.5}'"]),
    ("seg", "lseg", ["'[(0,0),(1,1)]'"]),
    ("bx", "box", ["'(1,1),(0,0)'", "'(2.5,3),(-1,-1)'"]),
    ("pth", "path", ["'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1))'"]),
    ("poly", "polygon", ["'((0,0),(1,1),(1,0))'"]),
    ("circ", "circle", ["'<(0,0),1.5>'"]),
    ("r4", "int4range", ["'[1,5)'", "'empty'", "'(,10]'", "'[3,)'", "'(,)'"]),
    ("r8", "int8range", ["'[-9223372036854775808,9223372036854775807)'"]),
    ("rn", "numrange", ["'[1.5,2.25]'", "'(,0.001)'"]),
    ("rd", "daterange", ["'[2024-01-01,2024-02-01)'", "'[-infinity,infinity)'"]),
    ("rts", "tsrange", ["'[2024-01-01 10:00,2024-01-01 11:30:00.5)'"]),
    ("rtz", "tstzrange", ["'[2024-01-01 10:00+02,)'", "'empty'"]),
    ("mr", "int4multirange", ["'{}'", "'{[1,3),[5,7)}'"]),
    ("mrd", "datemultirange", ["'{[2024-01-01,2024-01-05)}'"]),
    ("pair", "pair", ["ROW(1, 'a b')", "ROW(NULL, '')", "ROW(-3, 'q\"u,o(t)e\\\\')"]),
    ("span", "span", ["'[1,2)'", "'empty'"]),
    ("rt", "regtype", ["'integer'", "'pair'"]),
    ("ch", '"char"', ["'a'"]),
    ("nm", "name", ["'a name'"]),
    ("jp", "jsonpath", ["'$.a[*] ? (@ > 1)'"]),
    ("snap", "pg_snapshot", ["'10:20:10,14,15'"]),
    ("t", "tid", ["'(0,1)'", "'(4294967295,65535)'"]),
    # Arrays of the rendered types (held as their text form), NULL elements included.
    ("ips", "inet[]", ["ARRAY['1.2.3.4'::inet, NULL, '::1/128']", "'{}'"]),
    ("cashes", "money[]", ["ARRAY['-1.5'::money, '2']"]),
    ("boxes", "box[]", ["ARRAY['(1,1),(0,0)'::box, '(3,3),(2,2)']"]),
    ("pts", "point[]", ["ARRAY[point(1,2), NULL]"]),
    ("ranges", "int4range[]", ["ARRAY['[1,2)'::int4range, 'empty', NULL]"]),
    ("pairs", "pair[]", ["ARRAY[ROW(1, 'x')::pair, NULL, ROW(2, '\"')::pair]"]),
    ("vbitss", "varbit[]", ["ARRAY[B'1', B'', NULL]"]),
    ("macs", "macaddr[]", ["ARRAY['08:00:2b:01:02:03'::macaddr]"]),
    ("lsns", "pg_lsn[]", ["ARRAY['1/2'::pg_lsn, NULL]"]),
    ("tsvs", "tsvector[]", ["ARRAY['a b'::tsvector]"]),
]
# An array of every other type above, NULL element included (held as its text form).
COLUMNS += [
    (f"{name}_a", f"{kind}[]", [f"ARRAY[{values[0]}::{kind}, NULL, {values[-1]}::{kind}]"])
    for name, kind, values in list(COLUMNS)
    if not kind.endswith("[]")
    and name not in {"ip", "cash", "bx", "pt", "r4", "pair", "vbits", "mac", "lsn", "tsv"}
]

SETUP = """
CREATE TYPE pair AS (a int, b text);
CREATE TYPE span AS RANGE (subtype = float8);
"""


def _rows() -> list[dict[str, str]]:
    """Each column's values spread over rows (row i holds value i of every column, or NULL)."""
    depth = max(len(values) for _, _, values in COLUMNS)
    return [
        {name: values[i] for name, _, values in COLUMNS if i < len(values)} for i in range(depth)
    ]


def _create(publisher: PgDatabase, columns: list[tuple[str, str, list[str]]]) -> None:
    ddl = ", ".join(f"{name} {kind}" for name, kind, _ in columns)
    publisher.execute(
        SETUP
        + f"CREATE TABLE every (id int PRIMARY KEY, {ddl}); CREATE PUBLICATION pub FOR TABLE every"
    )


def _insert(publisher: PgDatabase, columns: list[tuple[str, str, list[str]]], first: int) -> None:
    names = [name for name, _, _ in columns]
    for i, row in enumerate(_rows()):
        values = ", ".join(row.get(name, "NULL") for name in names)
        publisher.execute(
            f"INSERT INTO every (id, {', '.join(names)}) VALUES ({first + i}, {values})"
        )


def _table(path: Path) -> list[dict[str, Any]]:
    table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda row: row["id"])


def _schema(path: Path) -> list[tuple[str, str]]:
    return [(f.name, str(f.type)) for f in deltalake.DeltaTable(str(path)).schema().fields]


def test_binary_mode_writes_every_type_as_text_mode_does(
    publisher_any: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    publisher = publisher_any
    columns = COLUMNS
    _create(publisher, columns)
    text_mode = Replication(publisher, spark, tmp_path / "text", name="text_mode")
    binary_mode = Replication(
        publisher, spark, tmp_path / "binary", name="binary_mode", binary=True
    )
    with text_mode, binary_mode:
        _insert(publisher, columns, first=1)
        # Updates and deletes carry binary old keys and new images of every column.
        publisher.execute(
            "UPDATE every SET ip = '2001:db8::1', pair = ROW(7, 'seven') WHERE id = 2"
        )
        publisher.execute("UPDATE every SET id = id + 100 WHERE id = 3")
        publisher.execute("DELETE FROM every WHERE id = 4")
        text_mode.caught_up()
        binary_mode.caught_up()
        text_path = Path(text_mode.path("public.every"))
        binary_path = Path(binary_mode.path("public.every"))
        assert _schema(binary_path) == _schema(text_path)
        text_rows, binary_rows = _table(text_path), _table(binary_path)
        assert len(text_rows) == len(_rows()) - 1
        for expected, actual in zip(text_rows, binary_rows, strict=True):
            differing = {k: (expected[k], actual[k]) for k in expected if expected[k] != actual[k]}
            assert not differing, f"row {expected['id']}: text vs binary {differing}"
    # Text mode holds each type's output function's text (inet_out, not text(inet)).
    first = text_rows[0]
    assert first["ip"] == "192.168.0.1"
    assert first["cash"] == publisher.fetchval("SELECT cash::text FROM every WHERE id = 1")
    assert first["pair"] == '(1,"a b")' and first["ips"] == "{1.2.3.4,NULL,::1}"
    assert first["boxes"] == "{(1,1),(0,0);(3,3),(2,2)}"  # box's array delimiter


def test_an_extension_type_in_binary_mode(
    publisher: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    """An extension type (hstore) arrives in its own binary form: the publisher, which has the
    type, gives its text form, as text mode carries it."""
    publisher.execute(
        "CREATE EXTENSION hstore;"
        "CREATE TABLE h (id int PRIMARY KEY, attrs hstore, many hstore[]);"
        "CREATE PUBLICATION pub FOR TABLE h"
    )
    with Replication(publisher, spark, tmp_path, binary=True) as rep:
        publisher.execute(
            'INSERT INTO h VALUES (1, \'a=>1, b=>NULL, "c d"=>"e"\','
            " ARRAY['x=>y'::hstore, NULL]), (2, '', NULL), (3, NULL, '{}')"
        )
        rep.caught_up()
        rep.assert_equal("public.h", key=("id",))
