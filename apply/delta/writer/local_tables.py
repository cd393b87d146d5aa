"""Delta tables through delta-rs, in a local folder or an object store: no Spark job, no JVM.

What the state store reads and appends where pgsub reaches the warehouse, the test of
when delta-rs may write a table at all (``delta_rs_can_write``; the initial
copy uses it too), and a table's existence and commit marks read from its
log. A target table's creation without Spark is ``apply.delta.writer.creation``'s.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from apply.core.errors import TargetTableError
from apply.delta.files.local_store import LocalStore
from apply.delta.files.storage import delta_rs_options, is_object_store
from apply.delta.files.store import LOG, canonical, commit_name, table_store
from apply.delta.writer.live_files import latest_version, make_durable, newest_commit

if TYPE_CHECKING:
    import deltalake

    from apply.core.records import CommitMark

# Writer features delta-rs 1.6 writes correctly; any other makes a write go through Spark.
DELTA_RS_WRITES: Final = frozenset({"appendOnly", "invariants", "timestampNtz"})

_ARROW_TYPES: Final = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "map<string,long>": pa.map_(pa.string(), pa.int64()),
}


def is_local_folder(location: str) -> bool:
    """Whether a warehouse (or table) location is on the local file system."""
    return "://" not in location or location.startswith("file:")


def reachable(location: str) -> bool:
    """Whether delta-rs and pgsub's own writer reach ``location`` from this process: a
    folder of this machine, or an object store (``apply.delta.files.storage``)."""
    return is_local_folder(location) or is_object_store(location)


def folder(location: str) -> str:
    """A local location as a plain path."""
    return location.removeprefix("file://").removeprefix("file:")


def where(location: str) -> str:
    """``location`` as delta-rs opens it: a plain path, or the object store's URL."""
    return folder(location) if is_local_folder(location) else location


def opened(location: str) -> deltalake.DeltaTable:
    """The Delta table at ``location``, opened by delta-rs with the storage it needs."""
    import deltalake

    return deltalake.DeltaTable(where(location), storage_options=delta_rs_options(location))


_LOGS: dict[str, deltalake.DeltaTable] = {}
_LOGS_LOCK = threading.Lock()
_LOG_READING: dict[str, threading.Lock] = {}
# A log's commit or checkpoint: a table has one once its creation committed.
_COMMITTED: Final = re.compile(r"/\d{20}(\.json|\.checkpoint.*\.parquet)$")


@contextmanager
def log_of(path: str) -> Iterator[deltalake.DeltaTable]:
    """The table at ``path`` as of its latest commit, to read its log (schema, properties,
    protocol, history) - not to write. In an object store one delta-rs table a path is
    kept between reads and brought forward (its new commits only): opening one made an
    S3 client and read the log from its checkpoint, about 9 ms, and the first batch after
    a start opened each table three times. Read anew when the version it had is gone
    (the table made anew). On a local folder, opened each time (under 2 ms)."""
    if not is_object_store(path):
        yield opened(path)
        return
    with _LOGS_LOCK:
        reading = _LOG_READING.setdefault(path, threading.Lock())
    with reading:
        table = _LOGS.pop(path, None)
        if table is not None and table_store(path).exists(commit_name(table.version())):
            table.update_incremental()
        else:
            table = opened(path)
        yield table
        _LOGS[path] = table


def delta_rs_can_write(path: str) -> bool:
    """Whether delta-rs may write the table at ``path`` (a local folder): its writer
    features are all ones delta-rs supports."""
    import deltalake

    try:
        with log_of(path) as table:
            protocol = table.protocol()
    except (deltalake.exceptions.DeltaError, OSError):
        return False
    return delta_rs_writes(protocol)


def delta_rs_writes(protocol: deltalake.table.ProtocolVersions) -> bool:
    """Whether delta-rs writes a table of ``protocol`` correctly."""
    features = set(protocol.writer_features or ())
    if protocol.min_writer_version < 7:
        # The legacy protocol: 3 adds CHECK constraints, 4 generated columns and change
        # data feed, 5 column mapping.
        return protocol.min_writer_version <= 2
    return features <= DELTA_RS_WRITES


def is_table(path: str) -> bool:
    """Whether ``path`` holds a Delta table with a commit (a ``_delta_log`` left empty by a
    creation cut short does not). In an object store: one listing of its log by the
    table's store, whose client is made once (delta-rs made one each time: 5 ms)."""
    import deltalake

    if is_object_store(path):
        logged = table_store(path).listed(LOG)
        return any(_COMMITTED.search(name) for name in logged)
    return bool(
        deltalake.DeltaTable.is_deltatable(where(path), storage_options=delta_rs_options(path))
    )


# delta-rs's names of Delta's primitive types, as Spark's simpleString spells them.
_SPARK_NAMES: Final = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}


def described(path: str) -> tuple[dict[str, str], dict[str, str]] | None:
    """The table's columns (name -> Spark's simpleString of its type) and its properties,
    read from its log by delta-rs, without a Spark job; None for a type this does not
    spell (Spark reads it then)."""
    import deltalake

    try:
        with log_of(path) as table:
            columns = {field.name: _spark_name(field.type) for field in table.schema().fields}
            properties = dict(table.metadata().configuration)
    except (deltalake.exceptions.DeltaError, OSError, LookupError):
        return None
    if None in columns.values():
        return None
    return {name: str(spelled) for name, spelled in columns.items()}, properties


def _spark_name(kind: object) -> str | None:
    from deltalake.schema import ArrayType, MapType, PrimitiveType

    if isinstance(kind, PrimitiveType):
        return _SPARK_NAMES.get(kind.type, kind.type)
    if isinstance(kind, ArrayType):
        element = _spark_name(kind.element_type)
        return None if element is None else f"array<{element}>"
    if isinstance(kind, MapType):
        key, value = _spark_name(kind.key_type), _spark_name(kind.value_type)
        return None if key is None or value is None else f"map<{key},{value}>"
    return None  # a struct: Spark spells it


def marked(mark: CommitMark) -> deltalake.CommitProperties:
    """A delta-rs commit carrying ``mark``: its ``userMetadata`` and idempotent-write id."""
    import deltalake

    app_id, version = mark.txn
    return deltalake.CommitProperties(
        custom_metadata={"userMetadata": mark.user_metadata()},
        app_transactions=[deltalake.Transaction(app_id=app_id, version=version)],
    )


def no_checkpoint() -> deltalake.PostCommitHookProperties:
    """delta-rs's own checkpoint after a commit, off: pgsub makes it at a version of the
    table's own (``apply.delta.writer.overwrite.keep_log``)."""
    import deltalake

    return deltalake.PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def as_table_holds(rows: pa.Table, held: pa.Schema) -> pa.Table:
    """``rows`` with a NULL column for each of ``held``'s (a table's) they lack: columns the
    publisher no longer sends, which the table keeps (delta-rs refuses rows without them)."""
    for column in held:
        if column.name not in rows.column_names:
            rows = rows.append_column(column, pa.nulls(rows.num_rows, column.type))
    return rows


def held_schema(table: deltalake.DeltaTable) -> pa.Schema:
    """The table's columns as Arrow fields."""
    return pa.schema(table.schema().to_arrow())


def row_count(path: str) -> int:
    """The rows of the table's latest version, read by delta-rs (no Spark, no JVM)."""

    return int(opened(path).to_pyarrow_dataset().count_rows())


def user_metadata(path: str, limit: int | None) -> list[str | None]:
    """The ``userMetadata`` of the table's latest ``limit`` commits (None: all), newest
    first, read from its log; DeltaError when delta-rs cannot read the log."""

    with log_of(path) as table:
        commits = table.history(limit)
    ordered = sorted(commits, key=lambda commit: -int(commit["version"]))
    return [commit.get("userMetadata") for commit in ordered]


def newest_user_metadata(path: str, limit: int) -> Iterator[str | None]:
    """The ``userMetadata`` of the table's latest ``limit`` commits, newest first, each
    commit read as it is asked for: the mark wanted is most often in the newest (pgsub's
    own), one file read, where delta-rs opens the log (its checkpoint and every commit
    since: 7 ms of CPU a table, 200 tables' first batch held for seconds) and reads
    ``limit`` commits. Ends early at a commit cleaned up (the older ones are too)."""
    store = table_store(path)
    newest = newest_commit(store)
    for version in range(newest, max(newest - limit, -1), -1):
        try:
            lines = store.read(commit_name(version)).decode().splitlines()
        except FileNotFoundError:
            return
        infos = (json.loads(line).get("commitInfo") for line in lines if '"commitInfo"' in line)
        info = next((i for i in infos if isinstance(i, dict)), {})
        metadata = info.get("userMetadata")
        yield None if metadata is None else str(metadata)


def ddl_schema(ddl: str) -> pa.Schema:
    """A state table's DDL (``a string, b map<string,long>``) as an Arrow schema."""
    fields = []
    for column in re.split(r",\s*(?![^<]*>)", ddl):
        name, kind = column.split(None, 1)
        fields.append(pa.field(name, _ARROW_TYPES[kind.replace(" ", "")]))
    return pa.schema(fields)


@dataclass
class _Read:
    """A state table as ``read_subscription`` last read it: its log, and every row of each of
    its live files, by the path the log names it by."""

    table: deltalake.DeltaTable
    files: dict[str, pa.Table]


_READS: dict[str, _Read] = {}
_READS_LOCK = threading.Lock()
_READING: dict[str, threading.Lock] = {}


def read_subscription(path: str, subscription: str) -> pa.Table | None:
    """The rows of ``subscription`` in the table at ``path`` (None: no table yet).

    The daemon reads its state tables every few seconds (an admin command's
    request, a table's state). The table's log is kept open between reads
    and brought forward (its new commits only), and each live file's rows are
    kept: a file never changes, so only the files added since the last read
    are read - in an object store, a read of a state table with nothing new
    is a HEAD and a LIST, where reading it whole was a GET a commit since its
    checkpoint and three requests a file (50 and more). A log whose version
    read last is gone (the table made anew) is read again from its start.

    delta-rs lists the table's live files and pyarrow reads them (from the local
    folder or the object store). Not ``DeltaTable.to_pyarrow_dataset``: its file
    system calls back into Python from Arrow's I/O threads, and about every other
    process that used it aborted at exit ("terminate called without an active
    exception", exit 134) - an admin command's exit code lost.
    """
    import deltalake
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    with _READS_LOCK:
        reading = _READING.setdefault(path, threading.Lock())
    store = table_store(path)
    with reading:
        before = _READS.pop(path, None)
        try:
            if before is not None and store.exists(commit_name(before.table.version())):
                table = before.table
                table.update_incremental()
            else:
                table, before = opened(path), None
            paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
            schema = pa.schema(table.schema().to_arrow())
        except deltalake.exceptions.TableNotFoundError:
            return None
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            raise TargetTableError(f"cannot read {path}: {exc}") from exc
        files: dict[str, pa.Table] = {}
        for logged in paths:
            rows = None if before is None else before.files.get(logged)
            if rows is None or rows.schema != schema:  # new, or read before a column was added
                source = store.source(canonical(logged, store.location))
                scan = ds.dataset(
                    [source], schema=schema, format="parquet", filesystem=store.filesystem
                )
                rows = scan.to_table()
            files[logged] = rows
        _READS[path] = _Read(table, files)
    wanted = pc.field("subscription") == subscription
    parts = [rows.filter(wanted) for rows in files.values()]
    return pa.concat_tables(parts) if parts else schema.empty_table()


# Tries of a state table's append whose commit lost to another writer's.
APPEND_ATTEMPTS: Final = 3


def append_rows(path: str, ddl: str, rows: list[tuple[Any, ...]]) -> None:
    """Append ``rows`` (tuples in ``ddl`` order) to the table at ``path``, made if absent;
    a column added to ``ddl`` joins an older table."""
    import deltalake

    schema = ddl_schema(ddl)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    table = pa.table(
        [
            pa.array([_arrow_value(v) for v in values], type=f.type)
            for values, f in zip(columns, schema, strict=True)
        ],
        schema=schema,
    )
    for attempt in range(1, APPEND_ATTEMPTS + 1):
        try:
            deltalake.write_deltalake(
                where(path),
                table,
                mode="append",
                schema_mode="merge",
                storage_options=delta_rs_options(path),
            )
            if is_local_folder(path):  # durable before the state it records is acted on
                store = LocalStore(folder(path))
                make_durable(store, latest_version(store))
            return
        except deltalake.exceptions.CommitFailedError as exc:
            # Nothing was committed, and a blind append may be made again on the newer
            # version: a writer of another process (this one's take turns) deleted or
            # compacted the rows the append's conflict check counts as read.
            if attempt == APPEND_ATTEMPTS:
                raise TargetTableError(f"cannot write to {path}: {exc}") from exc
        except (deltalake.exceptions.DeltaError, OSError) as exc:
            raise TargetTableError(f"cannot write to {path}: {exc}") from exc


def _arrow_value(value: object) -> object:
    return list(value.items()) if isinstance(value, dict) else value
