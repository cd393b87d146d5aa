"""A batch's rows appended to a table in one marked commit: a change log table's, and the
logical decoding messages'.

On a local warehouse that delta-rs may write, delta-rs appends them without
a Spark job (``LocalAppends``), after looking in the log whether the mark's
idempotent-write id (``mark.txn``) was committed already, as Spark's
``txnAppId`` does; otherwise Spark appends them with the same mark
(``TargetTable.append``). Either way a batch resent
after a crash between the commit and the flush confirmation is not
appended twice: the applier drops what the table's LSN says it has, and
this drops what its txn says it has.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import pyarrow as pa

from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetSchema
from apply.core.errors import TargetTableError
from apply.core.records import CommitMark, WriteResult
from apply.delta.spark.session import SparkErrors, arrow_frame
from apply.delta.writer.local_tables import (
    as_table_holds,
    delta_rs_writes,
    held_schema,
    marked,
    no_checkpoint,
    opened,
)
from apply.delta.writer.overwrite import keep_log

if TYPE_CHECKING:
    import deltalake

    from apply.delta.spark.target import TargetTable


class LocalAppends:
    """Appends by delta-rs, each table kept open between batches: brought up to date in
    milliseconds, where opening it replays its log (33 ms a table of 60 commits, paid by
    every table of every batch over 200 tables)."""

    def __init__(self) -> None:
        self._open: dict[str, deltalake.DeltaTable] = {}
        self._lock = threading.Lock()

    def forget(self, path: str) -> None:
        """The table was made again (or failed): open it afresh next time."""
        with self._lock:
            self._open.pop(path, None)

    def append(
        self, target: TargetTable, schema: TargetSchema, rows: pa.Table, mark: CommitMark
    ) -> WriteResult | None:
        """``rows`` (laid out as ``schema``) appended to ``target`` in one commit carrying
        ``mark``, unless a commit was made for ``mark`` before (the version is then None);
        None: delta-rs may not write this table (Spark's path). The caller holds the table
        for one writer."""
        import deltalake

        app_id, version = mark.txn
        try:
            table = self._table(target.path)
            if not delta_rs_writes(table.protocol()):
                return None
            done = table.transaction_version(app_id)
            if done is not None and done >= version:
                return WriteResult(schema.table, None)
            rows = as_table_holds(rows.cast(arrow_schema(schema.columns)), held_schema(table))
            deltalake.write_deltalake(
                table,
                rows,
                mode="append",
                commit_properties=marked(mark),
                post_commithook_properties=no_checkpoint(),
            )
            table.update_incremental()
            keep_log(table, target.path)
            return WriteResult(schema.table, table.version(), inserted=rows.num_rows)
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            self.forget(target.path)
            raise TargetTableError(
                f"appending {rows.num_rows} rows of {schema.table} to {target.path} at LSN "
                f"{mark.lsn} failed: {exc}"
            ) from exc

    def _table(self, path: str) -> deltalake.DeltaTable:

        with self._lock:
            table = self._open.get(path)
        if table is None:
            table = opened(path)
            with self._lock:
                self._open[path] = table
        else:
            table.update_incremental()
        return table


MESSAGES_DDL = (
    "subscription string, lsn long, lsn_text string, transactional boolean, xid long, "
    "end_lsn string, commit_time timestamp, prefix string, content binary, content_text string"
)


def append_messages(target: TargetTable, rows: pa.Table, mark: CommitMark) -> WriteResult:
    """Logical decoding messages (``apply.core.records.message_rows``) appended by Spark in one
    commit carrying ``mark``."""
    try:
        with target.marked(mark) as session:
            frame = arrow_frame(session, rows, MESSAGES_DDL)
            frame.write.format("delta").mode("append").save(target.path)
            return WriteResult(target.table, target.committed_version(), rows.num_rows)
    except SparkErrors as exc:
        raise TargetTableError(
            f"writing logical decoding messages to {target.path} failed: {exc}"
        ) from exc
