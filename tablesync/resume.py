"""A copy that resumes by range after a crash: what it keeps in the spool, and the SQL.

A keyed table read in several CTID ranges by this process stages each
range in the spool as it is read (``RangeStage``: Parquet files, then a
marker), beside a manifest naming the sync slot, its consistent point
(the copy's LSN, L), the snapshot's xmin and the table's relfilenodes.
Once every range is staged, the rows land in one Delta commit, as any
copy does. A crash before that keeps the staged ranges.

The next attempt cannot import the lost snapshot. It takes a new one,
S', keeps the sync slot (still at L) and reads under S':

- every range not staged yet, whole;
- the rows of the staged ranges that may have changed since the first
  snapshot: those whose ``xmin`` is at or after its xmin (``changed_since``;
  a row older than that was in the first snapshot at the same CTID, and
  so was staged);
- the keys of every such row in the table (``keys``).

Staged rows whose key is among those keys are dropped (their newer
version was just read); a staged row whose key is gone by S' stays, and
the catch-up from L deletes it, as it replays every change since L. So
the landed table holds each key once, some rows as of S' rather than L,
and the catch-up replays changes the table already shows: an insert of a
key it holds, or an update to a new key it holds, is applied over it
(``RESUMED_RESOLUTIONS``); only a key the catch-up has yet to delete is
missing, so an update or delete of a missing row is skipped.

The catch-up replays at least to where the WAL was once S' was taken
(``Manifest.read_at``), not only to the leader's position: a leader behind
S' (a backlog after the restart) would otherwise apply, once the table is
READY, the transactions between its position and S' - whose rows the table
already holds (an insert of a key it has: ``insert_exists``, the
subscription stopped on it). Ending there, SYNCDONE is at or past S', and
the leader applies the table's changes only after it, as PostgreSQL's does
when its sync worker is ahead.

A rewrite of the table between the attempts (VACUUM FULL, CLUSTER,
TRUNCATE: new relfilenodes, rows at new CTIDs) or a changed table layout
restarts the copy; so does a sync slot that moved or is gone.

A row whose ``xmin`` wrapped around (frozen long ago) may count as
changed: it is read again and replaces its staged copy, which is harmless.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql

from apply.arrival.spool_layout import SpoolLayout
from apply.columns.columnar import arrow_schema
from apply.columns.schema import TargetSchema
from conflicts.kinds import ConflictKind, Resolution
from subscriber.replication.lsn import Lsn
from tablesync.copy import BlockRange, RangeReader

# pg_partition_tree (SNAPSHOT_FACTS) is there from PostgreSQL 12; an older publisher's
# tables are copied again after a crash.
MIN_SERVER_VERSION: Final = 120000

XID_SPAN: Final = 1 << 32

CHANGED: Final = "changed"  # the staged ranges' rows read again under a later snapshot
KEYS: Final = "keys"  # the keys of every row read again (staged on a cluster)

# A snapshot's xmin (32 bits, as a row's xmin reads) and the table's leaf relations with
# their relfilenodes (a rewrite changes them), in the reading transaction's snapshot.
SNAPSHOT_FACTS: Final = """
SELECT pg_catalog.txid_snapshot_xmin(pg_catalog.txid_current_snapshot()) %% 4294967296,
       (SELECT pg_catalog.string_agg(
                   c.oid::text || ':' || pg_catalog.pg_relation_filenode(c.oid), ','
                   ORDER BY c.oid)
          FROM pg_catalog.pg_class c
         WHERE (c.oid = %(relid)s AND c.relkind = 'r')
            OR c.oid IN (SELECT t.relid
                           FROM pg_catalog.pg_partition_tree(%(relid)s::oid::regclass) t
                          WHERE t.isleaf))
"""

# The catch-up after a resumed copy: the table may already show a change it replays.
RESUMED_RESOLUTIONS: Final[Mapping[ConflictKind, Resolution]] = {
    ConflictKind.INSERT_EXISTS: Resolution.APPLY_REMOTE,
    ConflictKind.UPDATE_EXISTS: Resolution.APPLY_REMOTE,
    ConflictKind.UPDATE_MISSING: Resolution.SKIP,
    ConflictKind.DELETE_MISSING: Resolution.SKIP,
}


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a staged copy was read under; ``attempt`` counts the snapshots read so far."""

    slot: str
    lsn: Lsn  # the sync slot's consistent point: where the catch-up starts
    xmin: int  # the first snapshot's xmin, 32 bits
    relation: str  # the leaf relations and their relfilenodes (SNAPSHOT_FACTS)
    layout: str  # the target schema the staged files have
    ranges: tuple[BlockRange, ...]
    attempt: int = 1
    landed: bool = False  # every row is in the Delta table; the catch-up is left
    # The publisher's WAL position once the last attempt's snapshot was taken: every
    # transaction it shows ends at or before it, so the catch-up replays at least to here.
    read_at: Lsn | None = None

    @property
    def resumed(self) -> bool:
        return self.attempt > 1

    def landed_now(self) -> Manifest:
        return replace(self, landed=True)

    def to_json(self) -> str:
        return json.dumps(
            {
                "slot": self.slot,
                "lsn": str(self.lsn),
                "xmin": self.xmin,
                "relation": self.relation,
                "layout": self.layout,
                "ranges": [[r.first, r.stop] for r in self.ranges],
                "attempt": self.attempt,
                "landed": self.landed,
                "read_at": None if self.read_at is None else str(self.read_at),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(
            slot=data["slot"],
            lsn=Lsn.parse(data["lsn"]),
            xmin=int(data["xmin"]),
            relation=data["relation"],
            layout=data["layout"],
            ranges=tuple(BlockRange(first, stop) for first, stop in data["ranges"]),
            attempt=int(data["attempt"]),
            landed=bool(data["landed"]),
            read_at=Lsn.parse(data["read_at"]) if data.get("read_at") else None,
        )


def layout(schema: TargetSchema) -> str:
    """The staged files' shape: a staged copy of another shape cannot be resumed."""
    return json.dumps({"columns": schema.ddl(), "key": list(schema.key)})


def changed_since(xmin: int) -> sql.Composable:
    """Rows whose version may be newer than a snapshot with ``xmin``: their ``xmin`` is at
    or after it, modulo 2^32 (xids of the 2^31 before it count as older)."""
    return sql.SQL("((xmin::text::bigint - {} + 4294967296) % 4294967296) < 2147483648").format(
        sql.Literal(xmin % XID_SPAN)
    )


def within_any(ranges: Iterable[BlockRange]) -> sql.Composable:
    """The rows of any of ``ranges``."""
    conditions = [r.condition() or sql.SQL("true") for r in ranges]
    if not conditions:
        return sql.SQL("false")
    return sql.SQL(" OR ").join(sql.SQL("({})").format(c) for c in conditions)


def key_schema(schema: TargetSchema) -> TargetSchema:
    """``schema``'s key columns only."""
    return replace(schema, columns=tuple(schema.column(name) for name in schema.key))


def empty_keys(schema: TargetSchema) -> pa.Table:
    """No keys, typed as ``schema``'s key columns."""
    columns = key_schema(schema).columns
    return arrow_schema(columns).empty_table()


def without_keys(block: pa.Table, keys: pa.Table, key: Sequence[str]) -> pa.Table:
    """``block``'s rows whose key is not among ``keys``' rows."""
    if keys.num_rows == 0 or block.num_rows == 0:
        return block
    keys = keys.select(list(key)).cast(block.select(list(key)).schema)
    kept = block.join(keys, keys=list(key), join_type="left anti", use_threads=False)
    return kept.select(block.column_names)


def range_name(index: int) -> str:
    return f"range-{index:05d}"


class RangeStage:
    """One table's staged copy under the spool: ``manifest.json``, a folder of Parquet
    parts per staged range or changed-rows read, and ``<name>.done`` (the attempt that
    read it) once the folder is complete. Every file is synced before the marker."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def manifest(self) -> Manifest | None:
        try:
            return Manifest.from_json((self.root / "manifest.json").read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none, or cut short: not resumable

    def begin(self, manifest: Manifest) -> None:
        """Start a staged copy: whatever was staged before is removed."""
        self.clear()
        self.root.mkdir(parents=True, mode=0o700)
        self.record(manifest)

    def record(self, manifest: Manifest) -> None:
        _write_durably(self.root / "manifest.json", manifest.to_json().encode())

    def done(self) -> dict[str, int]:
        """The complete folders, each with the attempt that read it."""
        if not self.root.is_dir():
            return {}
        return {marker.stem: int(marker.read_text() or 0) for marker in self.root.glob("*.done")}

    def stage(self, name: str, blocks: Iterable[pa.Table], attempt: int) -> Iterator[pa.Table]:
        """Write each block as a Parquet part of folder ``name`` and pass it on; the folder
        is marked complete once ``blocks`` ends."""
        folder = self.root / name
        self.unmark(name)
        shutil.rmtree(folder, ignore_errors=True)  # what a killed attempt left of it
        folder.mkdir(mode=0o700)
        for number, block in enumerate(blocks):
            path = folder / f"part-{number:06d}.parquet"
            pq.write_table(block, path)
            _sync(path)
            yield block
        _sync(folder)
        self.mark(name, attempt)

    def mark(self, name: str, attempt: int) -> None:
        """Folder ``name`` is complete (here, or staged on the executors)."""
        _write_durably(self.root / f"{name}.done", str(attempt).encode())

    def unmark(self, name: str) -> None:
        (self.root / f"{name}.done").unlink(missing_ok=True)

    def read(self, name: str) -> Iterator[pa.Table]:
        for path in sorted((self.root / name).glob("part-*.parquet")):
            yield pq.read_table(path)

    def rows(self, name: str) -> int:
        """How many rows folder ``name`` holds (from the Parquet footers)."""
        return sum(
            pq.ParquetFile(path).metadata.num_rows
            for path in (self.root / name).glob("part-*.parquet")
        )

    def drop_rows(self) -> None:
        """Remove the staged rows, keep the manifest (they landed; the catch-up is left)."""
        for path in self.root.iterdir():
            if path.name != "manifest.json":
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def read_again_where(
    stage: RangeStage, manifest: Manifest
) -> tuple[sql.Composable, sql.Composable]:
    """What an attempt after the first reads again: (the rows of the ranges staged by earlier
    attempts that may have changed since the first snapshot, every such row of the table)."""
    staged = stage.done()
    before = [
        part
        for index, part in enumerate(manifest.ranges)
        if staged.get(range_name(index), manifest.attempt) < manifest.attempt
    ]
    since = changed_since(manifest.xmin)
    return sql.SQL("({}) AND ({})").format(within_any(before), since), since


def read_again(
    stage: RangeStage, manifest: Manifest, read: RangeReader, schema: TargetSchema
) -> pa.Table:
    """Under ``read``'s (later) snapshot: stage the rows of the ranges staged before that
    may have changed since the first snapshot; the keys of every such row in the table."""
    changed, since = read_again_where(stage, manifest)
    for _ in stage.stage(CHANGED, read.rows(changed), manifest.attempt):
        pass
    typed = empty_keys(schema)
    keys = read.rows(since, key_schema(schema))
    return pa.concat_tables([typed, *(block.cast(typed.schema) for block in keys)])


def landed_rows(
    stage: RangeStage, manifest: Manifest, keys: pa.Table | None, key: Sequence[str]
) -> Iterator[pa.Table]:
    """Every staged row to land: of each range, then the rows read again; a range staged
    by an earlier attempt without the rows whose key is in ``keys`` (read again since)."""
    staged = stage.done()
    missing = [i for i in range(len(manifest.ranges)) if range_name(i) not in staged]
    if missing:
        raise RuntimeError(f"ranges {missing} of the copy were not staged")
    for index in range(len(manifest.ranges)):
        name = range_name(index)
        stale = keys is not None and staged[name] < manifest.attempt
        for block in stage.read(name):
            yield without_keys(block, keys, key) if stale and keys is not None else block
    if keys is not None:
        yield from stage.read(CHANGED)


def forget_staged(spool_root: Path, copying: set[int]) -> None:
    """Remove the staged copies of tables no longer being copied (synchronized since, or
    removed from the subscription)."""
    for folder in SpoolLayout(spool_root).copy_ranges.glob("*"):
        if not (folder.name.isdigit() and int(folder.name) in copying):
            shutil.rmtree(folder, ignore_errors=True)


def next_attempt(manifest: Manifest) -> Manifest:
    return replace(manifest, attempt=manifest.attempt + 1)


def snapshot_facts(conn: Any, relid: int) -> tuple[int, str]:
    """(xmin, relation) of the snapshot ``conn``'s transaction reads under."""
    row = conn.execute(SNAPSHOT_FACTS, {"relid": relid}).fetchone()
    return int(row[0]), str(row[1] or "")


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    _sync(path.parent)
