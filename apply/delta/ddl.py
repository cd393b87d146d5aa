"""A publisher's schema change followed in its Delta table, at its LSN (``apply.ddl``).

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
message gets (``apply.schema.plan_evolution``). Any other one is a rewrite:
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

from apply.changelog import OLD, PREFIX
from apply.ddl import SchemaChange
from apply.delta import sql as delta_sql
from apply.features import COLUMN_MAPPING
from apply.schema import can_widen, normal_type, quote

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
    from pyspark.sql import functions as fn

    frame = delta_sql.read(session, path)
    types = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
    mapped = delta_sql.properties(session, path).get(COLUMN_MAPPING, "none") != "none"
    selected: dict[str, Column] = {name: fn.col(quote(name)) for name in types}
    done: list[str] = []
    rewrite = False

    renames = [(old, new) for old, new in change.renamed]
    renames += [(OLD + old, OLD + new) for old, new in change.renamed]  # a change log's
    for old, new in renames:
        if old not in types or new in types:
            continue  # done before, or never there
        if mapped:
            delta_sql.rename_column(session, path, old, new)
        else:
            selected = {(new if name == old else name): col for name, col in selected.items()}
            rewrite = True
        done.append(f"renamed {old} to {new}")
    if not keeps_history:
        for name in change.dropped:
            if name not in types:
                continue
            if mapped:
                delta_sql.drop_column(session, path, name)
            else:
                del selected[name]
                rewrite = True
            done.append(f"dropped {name}")
    for name, _, _ in change.retyped:
        wanted, current, kept = new_types.get(name), types.get(name), kept_name(name, change)
        if wanted is None or current is None or kept in types:
            continue
        if can_widen(normal_type(current), normal_type(wanted)):
            continue  # widened with the RELATION that follows
        cast = fn.expr(f"try_cast({quote(name)} AS {wanted})")
        selected = {n: (cast if n == name else c) for n, c in selected.items()}
        selected[kept] = fn.col(quote(name))
        rewrite = True
        done.append(f"retyped {name} from {current} to {wanted}, old values kept in {kept}")
    for name, value in fills.items():
        if name in types or name not in new_types:
            continue  # added before (the RELATION that followed), or done
        selected[name] = fn.lit(value).cast(new_types[name])
        rewrite = True
        done.append(f"added {name}, {value!r} in the rows there were (the publisher's default)")
    if rewrite:
        rows = frame.select(*[col.alias(name) for name, col in selected.items()])
        rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    return done
