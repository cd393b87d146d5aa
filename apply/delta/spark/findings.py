"""Which rows of a batch conflicted - looked up only when the MERGE says something did.

On the conflict-free path no other writer has rows in the table and the
MERGE's own metrics equal what the source predicts (``expected_counts``):
every chain that expected no row inserted, every chain that expected one
updated or deleted it. When they differ, or
when the MERGE raised (insert_exists / update_exists with the ``error``
action), ``find_keyed`` joins the source with the table as it was before the
MERGE and judges each chain on its first change (``conflicts.kinds.judge``).
The result is a ``Finding`` per conflicting chain: the remote row, the
existing local row (as text) and the transaction, for the conflict report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from apply.batching.collapse import KeyedNet
from apply.batching.source import FIRST
from apply.columns.columnar import to_arrow
from apply.columns.schema import TargetSchema, quote
from apply.delta.spark.origins import ROW_VERSION
from apply.delta.spark.session import arrow_frame
from conflicts.findings import Finding
from conflicts.kinds import First, judge

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROW = "__pgsub_row"
VERSION = "__pgsub_version"


def find_keyed(
    session: SparkSession,
    schema: TargetSchema,
    net: KeyedNet,
    target: DataFrame,
    foreign: frozenset[int] = frozenset(),
) -> list[Finding]:
    """Judge every chain of ``net`` against ``target`` (the table before the MERGE).

    ``foreign``: the Delta versions whose rows another writer changed
    (``apply.delta.spark.origins``); a chain that updates or deletes such a row is
    *_origin_differs.
    """
    from pyspark.sql import functions as fn

    rows = list(net.rows.values())
    if not rows:
        return []
    keys = list(schema.key)
    key_types = {name: schema.column(name).spark_type for name in keys}
    data: dict[str, Any] = {
        name: to_arrow(
            [row.key[i] for row in rows],
            schema.column(name).type,
            name,
            binary=net.key_is_binary(i),
        )
        for i, name in enumerate(keys)
    }
    data[FIRST] = [row.first.value for row in rows]
    data[ROW] = list(range(len(rows)))
    ddl = ", ".join(
        [f"{quote(k)} {key_types[k]}" for k in keys] + [f"{FIRST} string", f"{ROW} int"]
    )
    source = arrow_frame(session, pa.table(data), ddl)
    source = source.select(
        *[fn.col(quote(k)).cast(key_types[k]).alias(f"__pgsub_s{i}") for i, k in enumerate(keys)],
        FIRST,
        ROW,
    )
    version = fn.col(ROW_VERSION) if foreign else fn.lit(None).cast("long")
    local = target.select(
        *[fn.col(quote(k)).alias(f"__pgsub_k{i}") for i, k in enumerate(keys)],
        *[
            fn.col(quote(c.name)).cast("string").alias(f"__pgsub_v{i}")
            for i, c in enumerate(schema.columns)
        ],
        version.alias(VERSION),
    )
    on = [source[f"__pgsub_s{i}"] == local[f"__pgsub_k{i}"] for i in range(len(keys))]
    condition = on[0]
    for extra in on[1:]:
        condition = condition & extra
    joined = source.join(local, condition, "left").select(
        ROW,
        FIRST,
        local["__pgsub_k0"].isNotNull().alias("found"),
        *[f"__pgsub_v{i}" for i in range(len(schema.columns))],
        VERSION,
    )
    findings = []
    for hit in joined.collect():
        chain = rows[int(hit[ROW])]
        local_version = hit[VERSION]
        kind = judge(First(hit[FIRST]), bool(hit["found"]), local_version in foreign)
        if kind is None:
            continue
        existing = (
            {c.name: hit[f"__pgsub_v{i}"] for i, c in enumerate(schema.columns)}
            if hit["found"]
            else None
        )
        findings.append(
            Finding(
                kind.value,
                chain.first_tx,
                chain.key,
                chain.image,
                existing,
                local_version,
                key_kinds=net.key_kinds,
            )
        )
    findings.sort(key=lambda f: f.tx_index)
    return findings
