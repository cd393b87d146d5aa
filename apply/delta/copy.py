"""The initial copy into a target table: the blocks a table-sync worker read, in Delta.

With a local Spark the blocks are staged as Parquet files and land in one
commit; on a cluster each block is its own commit (see ``copy_into``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from apply.errors import TargetTableError
from apply.records import CommitMark, SparkErrors, struct
from apply.schema import TargetSchema
from apply.source import empty as source_empty

if TYPE_CHECKING:
    from apply.delta.tables import DeltaTables


def copy_into(
    tables: DeltaTables,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
    staging: Path,
) -> tuple[int, int | None]:
    """Replace the table's rows with ``blocks`` (the initial copy); (rows, version).

    With a local Spark the blocks are staged as Parquet files (written by
    pyarrow, one block in memory at a time) and land in one Delta commit
    carrying ``mark``: the copy is atomic, and no block travels inside a
    Spark task. Elsewhere (a cluster cannot read our local disk) each
    block is its own commit: the first overwrites whatever a failed
    attempt left, and only the last carries ``mark``.
    """
    path = tables.path(schema.table)
    try:
        if _local_master(tables):
            return _copy_staged(tables, schema, blocks, mark, path=path, staging=staging)
        return _copy_by_block(tables, schema, blocks, mark, path)
    except SparkErrors as exc:
        raise TargetTableError(f"copying {schema.table} into {path} failed: {exc}") from exc


def _local_master(tables: DeltaTables) -> bool:
    try:
        return str(tables.session().conf.get("spark.master", "")).startswith("local")
    except SparkErrors:
        return False


def _copy_staged(
    tables: DeltaTables,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
    *,
    path: str,
    staging: Path,
) -> tuple[int, int | None]:
    import pyarrow.parquet as pq

    shutil.rmtree(staging, ignore_errors=True)  # what a killed attempt left
    staging.mkdir(parents=True, mode=0o700)
    try:
        rows = 0
        for number, block in enumerate(blocks):
            pq.write_table(block, staging / f"part-{number:06d}.parquet")
            rows += block.num_rows
        with tables.marked(mark) as session:
            if rows:
                frame = session.read.schema(struct(schema.ddl())).parquet(str(staging))
            else:
                frame = tables.frame(session, source_empty(schema), schema)
            frame.write.format("delta").mode("overwrite").save(path)
            return rows, tables.committed_version(session)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_by_block(
    tables: DeltaTables,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
    path: str,
) -> tuple[int, int | None]:
    rows = 0
    mode = "overwrite"
    ahead = next(blocks, None)
    while True:
        block = ahead if ahead is not None else source_empty(schema)
        ahead = next(blocks, None)
        last = ahead is None
        with tables.marked(mark) if last else tables.noted(mark) as session:
            tables.frame(session, block, schema).write.format("delta").mode(mode).save(path)
            version = tables.committed_version(session) if last else None
        rows += block.num_rows
        mode = "append"
        if last:
            return rows, version
