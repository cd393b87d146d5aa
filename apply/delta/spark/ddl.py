"""A publisher's schema change followed in its Delta table, at its LSN
(``apply.schema_changes.ddl``).

A table with Delta's column mapping (a reader feature: ``table_features.
column_mapping: always``, or one it gained for a column name) renames and
drops a column in its metadata, as PostgreSQL does. A table without it -
every table by default, so that delta-rs and polars open it - is
rewritten once, in one commit, with the change made: the column renamed,
or gone. Either way a table kept with its history (``history`` other than
``mirror``) keeps a dropped column with its values, as before.

A column added with a default that every existing row took (PostgreSQL's
"fast default", which it never sends) is added with that value in the
rows there were, by a rewrite; one added with a volatile default (the
publisher computed a value row by row) is left to the RELATION, NULL in
those rows, and logged with the resync that fills them.

A type change Delta can widen is left to the widening every RELATION
message gets (``apply.columns.schema.plan_evolution``). Any other one is a rewrite:
the column keeps its name with the new type, each value cast (``try_cast``:
NULL where Spark cannot cast it as PostgreSQL did), and the old values stay
beside it in ``_pgsub_<column>_before_<LSN>``.

Each step looks first whether the table has it already (a batch applied
again after a crash), so following a change twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from apply.columns.schema import can_widen, normal_type, quote
from apply.core.features import COLUMN_MAPPING
from apply.delta.spark import sql as delta_sql
from apply.history.changelog import OLD, PREFIX
from apply.schema_changes.ddl import SchemaChange

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

log = structlog.get_logger(__name__)


def kept_name(column: str, change: SchemaChange) -> str:
    """Where a retyped column's old values stay."""
    return f"{PREFIX}{column}_before_{int(change.lsn):x}"


def follow(
    session: SparkSession,
    path: str,
    change: SchemaChange,
    new_types: Mapping[str, str],
    fills: Mapping[str, object],
    *,
    keeps_history: bool,
) -> list[str]:
    """Make ``change`` to the table at ``path``; what was done, as words for the log.
    ``new_types``: the Spark type of each retyped column and each added one in ``fills``
    (the value the rows there were took); ``keeps_history``: a table whose dropped columns
    stay."""
    table = _Following(session, path)
    renames = [(old, new) for old, new in change.renamed]
    renames += [(OLD + old, OLD + new) for old, new in change.renamed]  # a change log's
    for old, new in renames:
        table.rename(old, new)
    for name in () if keeps_history else change.dropped:
        table.drop(name)
    for name, _, _ in change.retyped:
        table.retype(name, new_types.get(name), kept_name(name, change))
    for name, value in fills.items():
        if name in new_types:
            table.fill(name, value, new_types[name])
    table.rewrite()
    return table.done


class _Following:
    """One table's columns as a schema change leaves them: changed in the table's metadata
    (column mapping), or in the one rewrite that ``rewrite`` makes."""

    def __init__(self, session: SparkSession, path: str) -> None:
        from pyspark.sql import functions as fn

        self._fn = fn
        self._session = session
        self._path = path
        self._frame = delta_sql.read(session, path)
        self._types = {f.name: f.dataType.simpleString() for f in self._frame.schema.fields}
        self._mapped = delta_sql.properties(session, path).get(COLUMN_MAPPING, "none") != "none"
        self._selected: dict[str, Column] = {name: fn.col(quote(name)) for name in self._types}
        self._rewritten = False
        self.done: list[str] = []

    def rename(self, old: str, new: str) -> None:
        if old not in self._types or new in self._types:
            return  # done before, or never there
        if self._mapped:
            delta_sql.rename_column(self._session, self._path, old, new)
        else:
            self._selected = {(new if n == old else n): c for n, c in self._selected.items()}
            self._rewritten = True
        self.done.append(f"renamed {old} to {new}")

    def drop(self, name: str) -> None:
        if name not in self._types:
            return
        if self._mapped:
            delta_sql.drop_column(self._session, self._path, name)
        else:
            del self._selected[name]
            self._rewritten = True
        self.done.append(f"dropped {name}")

    def retype(self, name: str, wanted: str | None, kept: str) -> None:
        current = self._types.get(name)
        if wanted is None or current is None or kept in self._types:
            return
        if can_widen(normal_type(current), normal_type(wanted)):
            return  # widened with the RELATION that follows
        cast = self._fn.expr(f"try_cast({quote(name)} AS {wanted})")
        self._selected = {n: (cast if n == name else c) for n, c in self._selected.items()}
        self._selected[kept] = self._fn.col(quote(name))
        self._rewritten = True
        self.done.append(f"retyped {name} from {current} to {wanted}, old values kept in {kept}")

    def fill(self, name: str, value: object, spark_type: str) -> None:
        if name in self._types:
            return  # added before (the RELATION that followed)
        self._selected[name] = self._fn.lit(value).cast(spark_type)
        self._rewritten = True
        self.done.append(
            f"added {name}, {value!r} in the rows there were (the publisher's default)"
        )

    def rewrite(self) -> None:
        """The one overwrite, when a change needed it."""
        if not self._rewritten:
            return
        rows = self._frame.select(*[col.alias(name) for name, col in self._selected.items()])
        writer = rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        writer.save(self._path)
