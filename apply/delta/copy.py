"""The initial copy into a target table: the blocks a table-sync worker read, in Delta.

Three ways, fastest first (``DeltaTables.copy_into`` picks):

- ``write_once``: delta-rs writes the Arrow blocks as they come straight
  into the table's Parquet files and commits them once, with the commit
  mark (idempotent-write id and ``userMetadata``) - each row is written
  once, no JVM round trip. For a warehouse on the local file system and a
  table whose writer features delta-rs supports (no column mapping, no
  type widening).
- with a local Spark, the blocks are staged as Parquet files and land in
  one Spark commit;
- on a cluster each block is its own commit (see ``copy_into``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pyarrow as pa

from apply.columnar import arrow_type
from apply.delta.session import SparkErrors, spark_master, struct
from apply.errors import TargetTableError
from apply.records import CommitMark
from apply.schema import TargetSchema
from apply.source import empty as source_empty

if TYPE_CHECKING:
    from apply.delta.target import TargetTable

# Writer features delta-rs 1.6 writes correctly; any other makes the copy go through Spark.
DELTA_RS_WRITES: Final = frozenset({"appendOnly", "invariants", "timestampNtz"})


def delta_rs_can_write(path: str) -> bool:
    """Whether delta-rs may write the table at ``path`` (a local folder): its writer
    features are all ones delta-rs supports."""
    import deltalake

    try:
        protocol = deltalake.DeltaTable(path).protocol()
    except (deltalake.exceptions.DeltaError, OSError):
        return False
    features = set(protocol.writer_features or ())
    if protocol.min_writer_version < 7:
        # The legacy protocol: 3 adds CHECK constraints, 4 generated columns and change
        # data feed, 5 column mapping.
        return protocol.min_writer_version <= 2
    return features <= DELTA_RS_WRITES


def write_once(
    target: TargetTable, schema: TargetSchema, blocks: Iterator[pa.Table], mark: CommitMark
) -> int:
    """Replace the table's rows with ``blocks`` in one delta-rs commit carrying ``mark``;
    the rows written."""
    import deltalake

    arrow_schema = pa.schema([(c.name, arrow_type(c.type)) for c in schema.columns])
    written = [0]

    def batches() -> Iterator[pa.RecordBatch]:
        for block in blocks:
            written[0] += block.num_rows
            yield from block.cast(arrow_schema).to_batches()

    app_id, version = mark.txn
    try:
        deltalake.write_deltalake(
            target.path,
            pa.RecordBatchReader.from_batches(arrow_schema, batches()),
            mode="overwrite",
            commit_properties=deltalake.CommitProperties(
                custom_metadata={"userMetadata": mark.user_metadata()},
                app_transactions=[deltalake.Transaction(app_id=app_id, version=version)],
            ),
        )
    except deltalake.exceptions.DeltaError as exc:
        raise TargetTableError(f"copying {schema.table} into {target.path} failed: {exc}") from exc
    return written[0]


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
    return spark_master(target.session).startswith("local")


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
