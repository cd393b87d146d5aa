"""A table's checkpoint written by pgsub from the actions it holds: no commit read again.

delta-rs makes a checkpoint from a snapshot it brings up to the checkpoint's version, then
reads the log again to write it: every commit since the last checkpoint is read four times,
412 GETs in an object store for a checkpoint every 100 commits, on the write of the batch
that makes it - 4.3 of a table's 9.6 requests a batch in a 20-minute bucket run
(docs/performance.md, "A checkpoint from what the writer holds"). Most of those commits
are pgsub's own (``apply.delta.writer.overwrite``, ``apply.delta.writer.vector_write``),
whose actions it holds as it makes them. So ``LogSince`` keeps what the commits since the
table's last checkpoint changed, and the next checkpoint is the last one (one GET) with
those changes applied, in Arrow:

- the last checkpoint's ``add`` rows less the files removed since; its ``remove`` rows
  (tombstones) less those added again or removed again since, and those older than
  ``delta.deletedFileRetentionDuration``; its ``txn``, ``protocol``, ``metaData`` and
  ``domainMetadata`` rows less those replaced since;
- the actions since, one row each (``commitInfo`` and ``cdc`` are not a checkpoint's);
- in delta-rs's checkpoint schema (``SCHEMA``: a classic single-file checkpoint, which
  Spark, delta-rs and pgsub's own log replay read), written whole to
  ``<version>.checkpoint.parquet`` and then ``_last_checkpoint`` (``TableStore.replace``):
  a PUT each.

The commits since the last checkpoint that this process did not make (before it started;
delta-rs's and Spark's) are read once each, all at once. What this does not follow - an
action or a field the schema has no place for, a remove naming no file it knows live, a
checkpoint in parts, V2 or in another schema - leaves the checkpoint to delta-rs, as before
(``apply.delta.writer.overwrite.keep_log``), and the one after it is pgsub's again.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from apply.delta.files.store import LOG, commit_name
from apply.delta.writer.checkpoint_actions import SCHEMA, LogSince, bodies
from apply.delta.writer.overwrite import checkpoint_due, keep_log

if TYPE_CHECKING:
    from apply.delta.files.store import TableStore
    from apply.delta.writer.open_table import OpenTable

log = structlog.get_logger(__name__)

_RETENTION: Final = re.compile(r"\s*interval\s+(\d+)\s+(\w+?)s?\s*", re.IGNORECASE)
_UNITS: Final = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}
# Delta's retentions, and their defaults.
_TOMBSTONES: Final = ("delta.deletedFileRetentionDuration", 7 * 86_400_000)
_LOG: Final = ("delta.logRetentionDuration", 30 * 86_400_000)
# The most commits read at once to make a checkpoint; a log further behind its last one is
# delta-rs's to checkpoint.
_MOST_READ: Final = 1000


def keep_log_of(open_table: OpenTable) -> None:
    """After a commit pgsub made to ``open_table`` (its latest): the table's checkpoint, if
    its version is due one - pgsub's own from what it holds, else delta-rs's - and the
    removal of its expired log files."""
    store = open_table.store
    version = open_table.version
    configuration = open_table.configuration
    if not checkpoint_due(version, configuration, store.location):
        return
    since = open_table.since
    if since is None or since.version != version or not since.followed:
        since = _read_since(store, version)
    if since is None or not since.followed:
        keep_log(open_table.synced(), store.location)
    else:
        try:
            written = _write(store, since, configuration)
        except (OSError, pa.ArrowException) as exc:  # the batch is committed: not its error
            log.warning(
                "checkpoint not written", table=store.location, version=version, error=str(exc)
            )
            open_table.since = None
            return
        if not written:
            keep_log(open_table.synced(), store.location)
        else:
            open_table.checkpointed()
            clean_log(store, version, configuration)
    open_table.since = LogSince(version)


def _read_since(store: TableStore, version: int) -> LogSince | None:
    """The commits since the table's last checkpoint through ``version``, read from the log
    (all at once); None: the log does not say where its last checkpoint is, or a commit is
    gone."""
    try:
        base = int(json.loads(store.read(f"{LOG}/_last_checkpoint"))["version"])
    except FileNotFoundError:
        base = -1
    except (ValueError, KeyError, TypeError):
        return None
    if base >= version or version - base > _MOST_READ:
        return None
    since = LogSince(base)
    try:
        commits = store.read_each([commit_name(v) for v in range(base + 1, version + 1)])
    except FileNotFoundError:
        return None
    for at, data in enumerate(commits, start=base + 1):
        since.take(at, [json.loads(line) for line in data.decode().splitlines() if line])
    return since


def _write(store: TableStore, since: LogSince, configuration: Mapping[str, str]) -> bool:
    """The checkpoint at ``since.version``, and ``_last_checkpoint`` naming it; False: the
    base checkpoint is not one this follows, nothing written."""
    base = _base(store, since.base)
    if base is None:
        return False
    cutoff = int(time.time() * 1000) - _retention_ms(configuration, _TOMBSTONES)
    kept = _kept_rows(base, since, cutoff)
    if kept is None:
        return False
    rows: list[dict[str, Any]] = []
    if since.protocol is not None:
        rows.append({"protocol": since.protocol})
    if since.metadata is not None:
        rows.append({"metaData": _metadata(since.metadata)})
    rows += [{"txn": txn} for txn in since.txns.values()]
    rows += [{"domainMetadata": domain} for domain in since.domains.values()]
    rows += [{"add": {"partitionValues": {}, **add}} for add in bodies(since.adds)]
    rows += [
        {"remove": remove}
        for remove in bodies(since.removes)
        if int(remove.get("deletionTimestamp") or 0) >= cutoff
    ]
    table = pa.concat_tables([kept, pa.Table.from_pylist(rows, schema=SCHEMA)])
    if not _complete(table):
        return False
    body = pa.BufferOutputStream()  # Arrow's memory: no call into Python a page
    pq.write_table(table, body, compression="snappy")
    data = body.getvalue().to_pybytes()
    store.replace(f"{LOG}/{since.version:020d}.checkpoint.parquet", data)
    adds = pc.sum(pc.is_valid(table.column("add"))).as_py() or 0
    last = {"version": since.version, "size": table.num_rows, "sizeInBytes": len(data)}
    store.replace(f"{LOG}/_last_checkpoint", json.dumps({**last, "numOfAddFiles": adds}).encode())
    return True


def _base(store: TableStore, version: int) -> pa.Table | None:
    """The rows of the table's checkpoint at ``version`` in ``SCHEMA`` (none: -1); None: it
    is not one file, or not in a schema this writes."""
    if version < 0:
        return SCHEMA.empty_table()
    try:
        data = store.read(f"{LOG}/{version:020d}.checkpoint.parquet")  # one GET: not one a column
        table = pq.read_table(pa.BufferReader(data))
    except FileNotFoundError:
        return None  # in parts, or V2: delta-rs's to follow
    if not table.schema.equals(SCHEMA):
        try:
            table = table.cast(SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            return None
    sidecars = table.column("sidecar")
    return table if sidecars.null_count == len(sidecars) else None


def _kept_rows(base: pa.Table, since: LogSince, cutoff: int) -> pa.Table | None:
    """The base checkpoint's rows that stay; None: a file removed since that it does not
    hold live (a path spelled two ways, a log this does not follow)."""
    adds = base.column("add")
    add_keys = _file_keys(adds)
    live = pc.fill_null(pc.is_valid(adds), False)
    if not since.gone <= set(pc.filter(add_keys, live).to_pylist()):
        return None
    replaced = pa.array([*since.adds, *since.gone], pa.string())
    keep_add = pc.and_(live, pc.invert(pc.fill_null(pc.is_in(add_keys, replaced), False)))
    removes = base.column("remove")
    removed_again = pa.array([*since.adds, *since.removes], pa.string())
    recent = pc.greater_equal(
        pc.fill_null(pc.struct_field(removes, "deletionTimestamp"), 0), pa.scalar(cutoff)
    )
    keep_remove = pc.and_(
        pc.and_(pc.fill_null(pc.is_valid(removes), False), pc.fill_null(recent, False)),
        pc.invert(pc.fill_null(pc.is_in(_file_keys(removes), removed_again), False)),
    )
    keep_txn = _not_replaced(base.column("txn"), "appId", since.txns)
    keep_domain = _not_replaced(base.column("domainMetadata"), "domain", since.domains)
    keep_protocol = pc.and_(pc.is_valid(base.column("protocol")), since.protocol is None)
    keep_metadata = pc.and_(pc.is_valid(base.column("metaData")), since.metadata is None)
    keep = keep_add
    for mask in (keep_remove, keep_txn, keep_domain, keep_protocol, keep_metadata):
        keep = pc.or_(keep, mask)
    return base.filter(keep)


def _not_replaced(rows: pa.ChunkedArray, name: str, replaced: Mapping[str, Any]) -> pa.ChunkedArray:
    """Which of ``rows`` (a struct column) hold an action whose ``name`` field is not among
    ``replaced``."""
    names = pa.array(list(replaced), pa.string())
    found = pc.fill_null(pc.is_in(pc.struct_field(rows, name), names), False)
    return pc.and_(pc.fill_null(pc.is_valid(rows), False), pc.invert(found))


def _file_keys(files: pa.ChunkedArray) -> pa.ChunkedArray:
    """``checkpoint_actions.file_key`` of each ``add`` or ``remove`` row (null where the row
    holds none)."""
    vector = pc.struct_field(files, "deletionVector")

    def part(name: str) -> pa.ChunkedArray:
        values = pc.struct_field(vector, name)
        return pc.fill_null(pc.cast(values, pa.string()), "")

    return pc.binary_join_element_wise(
        pc.struct_field(files, "path"),
        part("storageType"),
        part("pathOrInlineDv"),
        part("offset"),
        "\0",
    )


def _metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """A ``metaData`` action with the fields the schema holds non-null filled as Delta's
    readers take them when absent."""
    shaped = {"partitionColumns": [], "configuration": {}, **metadata}
    shaped["format"] = {"options": {}, **(metadata.get("format") or {"provider": "parquet"})}
    return shaped


def _complete(table: pa.Table) -> bool:
    """Whether ``table`` holds one protocol and one metadata row (a checkpoint must)."""
    protocols = pc.sum(pc.is_valid(table.column("protocol"))).as_py()
    metadata = pc.sum(pc.is_valid(table.column("metaData"))).as_py()
    if protocols == 1 and metadata == 1:
        return True
    log.warning("own checkpoint incomplete", protocols=protocols, metadata=metadata)
    return False


def clean_log(store: TableStore, version: int, configuration: Mapping[str, str]) -> None:
    """The log's expired files removed, as Spark's and delta-rs's cleanup does: the commits
    and checkpoints older than ``delta.logRetentionDuration`` (30 days unless set) that come
    before the newest checkpoint as old, at or below ``version`` - every version kept is
    still read from a checkpoint and the commits after it, and the checkpoint's own commit
    stays (Spark reads it). The log is listed from its oldest file and no further than the
    first younger than the retention: in an object store one listing, where delta-rs
    listed the whole log (a week of commits: 600 listings)."""
    cutoff = time.time() - _retention_ms(configuration, _LOG) / 1000
    expired: list[tuple[int, str]] = []
    for name, modified in store.oldest(LOG):
        base = name.rsplit("/", 1)[-1]
        if not base[:20].isdigit():
            continue  # _last_checkpoint, a temporary file
        if modified > cutoff:
            break
        if int(base[:20]) <= version:
            expired.append((int(base[:20]), name))
    keep = max((at for at, name in expired if ".checkpoint." in name), default=None)
    if keep is not None:
        store.delete_each([name for at, name in expired if at < keep])


def _retention_ms(configuration: Mapping[str, str], setting: tuple[str, int]) -> int:
    """A retention ``setting`` (its property, its default) in milliseconds; a value this
    does not read keeps everything."""
    key, default = setting
    value = configuration.get(key)
    if value is None:
        return default
    match = _RETENTION.fullmatch(value)
    if match is None or match[2].lower() not in _UNITS:
        return 2**62
    return int(match[1]) * _UNITS[match[2].lower()]
