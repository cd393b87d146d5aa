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

from apply.delta.session import SparkErrors, struct
from apply.errors import TargetTableError
from apply.records import CommitMark
from apply.schema import TargetSchema
from apply.source import empty as source_empty

if TYPE_CHECKING:
    from apply.delta.target import TargetTable


def copy_into(
    target: TargetTable,
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
    try:
        if _local_master(target):
            return _copy_staged(target, schema, blocks, mark, staging)
        return _copy_by_block(target, schema, blocks, mark)
    except SparkErrors as exc:
        raise TargetTableError(f"copying {schema.table} into {target.path} failed: {exc}") from exc


def _local_master(target: TargetTable) -> bool:
    try:
        return str(target.session.conf.get("spark.master", "")).startswith("local")
    except SparkErrors:
        return False


def _copy_staged(
    target: TargetTable,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
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
        with target.marked(mark) as session:
            if rows:
                frame = session.read.schema(struct(schema.ddl())).parquet(str(staging))
            else:
                frame = target.frame(source_empty(schema), schema)
            frame.write.format("delta").mode("overwrite").save(target.path)
            return rows, target.committed_version()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_by_block(
    target: TargetTable,
    schema: TargetSchema,
    blocks: Iterator[pa.Table],
    mark: CommitMark,
) -> tuple[int, int | None]:
    rows = 0
    mode = "overwrite"
    ahead = next(blocks, None)
    while True:
        block = ahead if ahead is not None else source_empty(schema)
        ahead = next(blocks, None)
        last = ahead is None
        with target.marked(mark) if last else target.noted(mark):
            target.frame(block, schema).write.format("delta").mode(mode).save(target.path)
            version = target.committed_version() if last else None
        rows += block.num_rows
        mode = "append"
        if last:
            return rows, version
