"""Target table schemas and their evolution (docs/architecture.md, "Types", "Schema changes"). Pure.

``TargetSchema`` is what a Delta table should look like for a publisher
relation: its columns with resolved types and its key. ``plan_evolution``
compares it with an existing Delta table's columns and says what to do:
add new columns, widen types Delta can widen in place, keep dropped columns
(NULL from then on), or stop with an error naming the column when a type
changed in a way Delta cannot follow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from apply.columns.typemap import ColumnType, TypeLookup, resolve
from apply.core.errors import ApplyError
from subscriber.replication.messages import Relation


@dataclass(frozen=True, slots=True)
class TargetColumn:
    name: str
    type: ColumnType

    @property
    def spark_type(self) -> str:
        return self.type.spark_type


@dataclass(frozen=True, slots=True)
class TargetSchema:
    table: str  # schema.name on the publisher
    columns: tuple[TargetColumn, ...]
    key: tuple[str, ...]  # empty: the table is a multiset (REPLICA IDENTITY FULL or none)

    def ddl(self) -> str:
        return ", ".join(f"{quote(c.name)} {c.spark_type}" for c in self.columns)

    def column(self, name: str) -> TargetColumn:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)


def quote(identifier: str) -> str:
    """A Spark SQL identifier, backtick-quoted."""
    return "`" + identifier.replace("`", "``") + "`"


def target_schema(relation: Relation, lookup: TypeLookup, keyed: bool) -> TargetSchema:
    columns = tuple(
        TargetColumn(c.name, resolve(c.type_oid, c.typmod, lookup)) for c in relation.columns
    )
    key = tuple(c.name for c in relation.columns if c.is_key) if keyed else ()
    return TargetSchema(relation.qualified_name, columns, key)


class SchemaMismatchError(ApplyError):
    """The publisher's table changed in a way the Delta table cannot follow."""


@dataclass(frozen=True, slots=True)
class Evolution:
    add: tuple[TargetColumn, ...] = ()
    widen: tuple[tuple[str, str, str], ...] = ()  # (column, from, to)
    dropped: tuple[str, ...] = ()  # kept in Delta, no longer published

    def __bool__(self) -> bool:
        return bool(self.add or self.widen)


_INTEGER_RANK: Final = {"byte": 0, "short": 1, "int": 2, "long": 3}
_DECIMAL: Final = re.compile(r"^decimal\((\d+),(\d+)\)$")


def can_widen(old: str, new: str) -> bool:
    """Whether Delta's type widening moves a column from ``old`` to ``new`` losslessly."""
    if old == new:
        return True
    if old in _INTEGER_RANK and new in _INTEGER_RANK:
        return _INTEGER_RANK[old] < _INTEGER_RANK[new]
    if (old, new) in {("float", "double"), ("date", "timestamp_ntz")}:
        return True
    old_dec, new_dec = _DECIMAL.match(old), _DECIMAL.match(new)
    if old_dec and new_dec:
        old_p, old_s = int(old_dec.group(1)), int(old_dec.group(2))
        new_p, new_s = int(new_dec.group(1)), int(new_dec.group(2))
        return new_s >= old_s and new_p - new_s >= old_p - old_s
    return False


def normal_type(spark_type: str) -> str:
    """Spark's simpleString spellings to ours (``bigint`` is ``long``, ...)."""
    aliases = {"bigint": "long", "smallint": "short", "integer": "int", "tinyint": "byte"}
    text = spark_type.replace(" ", "").lower()
    return aliases.get(text, text)


@dataclass
class _Plan:
    add: list[TargetColumn] = field(default_factory=list)
    widen: list[tuple[str, str, str]] = field(default_factory=list)


def plan_evolution(
    existing: Mapping[str, str], wanted: TargetSchema, subscription: str = ""
) -> Evolution:
    """What to change in a Delta table with ``existing`` columns (name -> Spark type)."""
    plan = _Plan()
    for column in wanted.columns:
        current = existing.get(column.name)
        if current is None:
            plan.add.append(column)
            continue
        old, new = normal_type(current), normal_type(column.spark_type)
        if old == new:
            continue
        if can_widen(old, new):
            plan.widen.append((column.name, old, new))
            continue
        raise SchemaMismatchError(
            f"column {column.name!r} of {wanted.table} changed type on the publisher from "
            f"{old} to {new}, which the Delta table cannot follow in place; resynchronise the "
            f"table (`pgsub resync -c ... {subscription or 'SUBSCRIPTION'} {wanted.table}`) "
            "after moving the old Delta table away"
        )
    names = {c.name for c in wanted.columns}
    dropped = tuple(name for name in existing if name not in names)
    return Evolution(tuple(plan.add), tuple(plan.widen), dropped)
