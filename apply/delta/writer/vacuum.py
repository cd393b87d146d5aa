"""VACUUM by pgsub itself where it reaches the warehouse: no JVM, a few requests a table.

Spark's VACUUM of a table in a bucket took 8.4 s a table at the median on
this machine (loading its snapshot through S3A, then a Spark job), and the
batches of 200 tables were 1.3-2.7 times longer while a round of them ran
(docs/performance.md, "40 minutes of 200 tables in a bucket"). ``vacuum``
does what Delta's full VACUUM does, with pgsub's own log reader
(``apply.delta.writer.live_files``):

- what stays: every file the table's latest version names (its live files
  and their deletion vectors), and every file a ``remove`` of the last
  ``retention`` names, with its vector (an older version a reader may still
  read, or travel back to). The tombstones come from the latest checkpoint
  (Delta keeps a ``remove`` there for ``delta.deletedFileRetentionDuration``,
  which maintenance sets to the retention) and the commits after it;
- what goes: any other file of the table's folders that is older than
  ``retention`` - what a commit removed before the retention, what a
  killed writer left. A file younger than that is never deleted, whoever
  wrote it: a writer's file not committed yet is safe, so it runs beside
  the table's writers, holds nothing and commits nothing (as pgsub's Spark
  VACUUMs, whose ``VACUUM START``/``END`` entries are off);
- the log's folder and other hidden folders (``_``, ``.``) are left as they
  are, except ``_change_data``, whose files no version names and which go
  once older than ``retention`` (as Delta's VACUUM does).

One listing of the table's folders (in an object store a request a thousand
files, without the log's folder), the checkpoint and the commits after it,
and one request a thousand files deleted. A log pgsub does not read (a V2
checkpoint, a partitioned table, a checkpoint without tombstones) is an
``UnreadableLogError``: the caller VACUUMs with Spark instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final

from apply.core.errors import TargetTableError
from apply.delta.files.store import LOG, canonical
from apply.delta.writer.deletion_vectors import Descriptor
from apply.delta.writer.live_files import LiveFiles, UnreadableLogError, newest_commit

if TYPE_CHECKING:
    import pyarrow as pa

    from apply.delta.files.store import TableStore

# The hidden folder whose files Delta's VACUUM deletes past the retention (change data).
CHANGE_DATA: Final = "_change_data"


@dataclass(frozen=True, slots=True)
class Swept:
    """What ``vacuum`` did: the files it deleted, and the files it kept."""

    deleted: list[str]
    kept: int


class _Named(LiveFiles):
    """The table's live files, and the files its tombstones name, with their vectors."""

    _columns: ClassVar[list[str]] = ["add", "remove"]

    def __init__(self, store: TableStore, since_ms: float) -> None:
        super().__init__(store)
        self.since_ms = since_ms
        self.tombstones: set[str] = set()

    def _log_listing(self) -> list[str]:
        """The log's files from its last checkpoint on (a week of commits is 600,000
        files: listing them all is 600 requests in an object store)."""
        try:
            checkpoint = int(json.loads(self.store.read(f"{LOG}/_last_checkpoint"))["version"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return super()._log_listing()
        return self.store.listed_after(LOG, f"{LOG}/{checkpoint:020d}")

    def _checkpointed(self, read: pa.Table) -> None:
        if "remove" not in read.column_names:
            raise UnreadableLogError(
                f"{self.store.location}: a checkpoint without its tombstones (no remove "
                "column): pgsub's VACUUM cannot tell which removed files a reader may need"
            )
        for remove in read.column("remove").to_pylist():
            if remove is not None:
                self._removed(remove)

    def _removed(self, remove: dict[str, object]) -> None:
        when = remove.get("deletionTimestamp")
        if when is not None and float(str(when)) < self.since_ms:
            return  # removed before the retention: its file may go
        self.tombstones.update(_files(remove, self.store.location))

    def named(self) -> set[str]:
        names = set(self.tombstones)
        for file in self.files:
            names.add(file.name)
            if file.vector is not None:
                names.update(_vector_file(file.vector, self.store.location))
        return names


def _files(action: dict[str, object], location: str) -> list[str]:
    """The file an ``add`` or ``remove`` names, and its deletion vector's file."""
    names = [canonical(str(action["path"]), location)]
    vector = action.get("deletionVector")
    if isinstance(vector, dict):
        names += _vector_file(Descriptor.of(vector), location)
    return names


def _vector_file(vector: Descriptor, location: str) -> list[str]:
    """The file holding ``vector``, as the table's listing names it: relative to the table
    when inside it - an absolute path (``p``) too -; none for an inline one."""
    if vector.storage_type == "p":
        return [canonical(vector.path_or_inline, location)]
    return [vector.name] if vector.storage_type == "u" else []


def vacuum(store: TableStore, retention: float, *, now: float | None = None) -> Swept:
    """Delete the files of the table in ``store`` that its history of ``retention`` seconds
    does not name and that are older than it (see the module)."""
    import obstore

    since = (time.time() if now is None else now) - retention
    try:
        version = newest_commit(store)
        if version < 0:
            return Swept([], 0)
        log = _Named(store, since * 1000)
        log.read(version)
        named = log.named()
        old: list[str] = []
        kept = 0
        for name, modified in _listed(store):
            if _named_by(name) in named or modified >= since:
                kept += 1
            else:
                old.append(name)
        store.delete_each(old)
    except (OSError, ValueError, obstore.exceptions.BaseError) as exc:
        raise TargetTableError(f"VACUUM of {store.location} failed: {exc}") from exc
    return Swept(old, kept)


def _listed(store: TableStore) -> list[tuple[str, float]]:
    """Every file of the table's folders but the hidden ones (``_change_data`` is
    listed), with its modification time."""
    found: list[tuple[str, float]] = []
    folders = [""]
    while folders:
        files, inner = store.contents(folders.pop())
        found.extend(files)
        for folder in inner:
            base = folder.rsplit("/", 1)[-1]
            if base == CHANGE_DATA or not base.startswith(("_", ".")):
                folders.append(folder)
    return [(name, modified) for name, modified in found if _named_by(name) is not None]


def _named_by(name: str) -> str | None:
    """The file whose fate ``name`` shares: itself; the file a Hadoop checksum beside it
    (``.<file>.crc``, which Spark writes on a local disk) is for; None for another hidden
    file (``.``, ``_``: a writer's temporary, a marker), which Delta's VACUUM leaves."""
    folder, _, base = name.rpartition("/")
    if not base.startswith(("_", ".")):
        return name
    if base.startswith(".") and base.endswith(".crc") and len(base) > 5:
        inner = base[1:-4]
        return f"{folder}/{inner}" if folder else inner
    return None
