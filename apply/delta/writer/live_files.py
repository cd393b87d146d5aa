"""A table's live files with their deletion vectors, as its Delta log says.

delta-rs lists a table's files but not the deletion vector each carries,
and a commit that gives a file a new vector must name the old one in its
``remove`` (Delta's protocol: a file is the pair of its path and its
vector). ``LiveFiles`` replays the log for them: the latest checkpoint it
can read (one Parquet file, or every part of a multi-part one), then the
JSON commits after it; after that only the commits it has not read, and
pgsub's own commits as it makes them (``applied``).

A file is known by its path as the log spells it, decoded
(``apply.delta.files.store.canonical``): an ``add`` and a ``remove`` that spell
one file two ways (``a%20b`` and ``a b``, ``file:/t/a`` and ``file:///t/a``,
the absolute path of a relative one) are one file.

What it does not read is an ``UnreadableLogError``, never a wrong answer:
a V2 checkpoint (UUID-named, or with sidecars: the ``v2Checkpoint``
feature, which ``apply.delta.writer.vector_write.vector_writable`` refuses before
this is asked), a partitioned table. A multi-part checkpoint missing a part
is passed over for an older one, or for the commits from the first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Final

import pyarrow.parquet as pq

from apply.core.errors import TargetTableError
from apply.delta.files.local_store import LocalStore
from apply.delta.files.store import LOG, canonical, commit_name
from apply.delta.writer.deletion_vectors import Descriptor

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    import pyarrow as pa

    from apply.core.records import CommitMark
    from apply.delta.files.store import TableStore

_COMMIT: Final = re.compile(r"(\d{20})\.json")
_CLASSIC: Final = re.compile(r"(\d{20})\.checkpoint\.parquet")
_PART: Final = re.compile(r"(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet")
_V2: Final = re.compile(r"(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)")


@dataclass(frozen=True, slots=True)
class VectorFile:
    """A live data file: its ``add`` action as the log holds it."""

    path: str  # as the log spells it (what a ``remove`` names)
    name: str  # the file, decoded: relative to the table, or absolute
    size: int
    modification_time: int
    stats: str | None  # the ``add``'s statistics (JSON), as written
    vector: Descriptor | None  # the rows it deletes, if any

    @property
    def identity(self) -> tuple[str, str | None]:
        """What tells live files apart: the file and its vector (Delta's protocol)."""
        return self.name, None if self.vector is None else self.vector.unique_id

    def rows(self) -> int | None:
        """The rows the file holds (deleted ones too), from its statistics."""
        if self.stats is None:
            return None
        count = json.loads(self.stats).get("numRecords")
        return None if count is None else int(count)

    def with_vector(self, vector: Descriptor) -> VectorFile:
        return replace(self, vector=vector)


class UnreadableLogError(TargetTableError):
    """A log pgsub does not replay itself (a V2 checkpoint, a partitioned table)."""


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    version: int
    parts: list[str]  # every part, in order


class LiveFiles:
    """The live files of the table in ``store``, as of ``version``."""

    # What a checkpoint is read for (``_checkpointed`` is given the rest).
    _columns: ClassVar[list[str]] = ["add"]

    def __init__(self, store: TableStore) -> None:
        self.store = store
        self.version = -1
        self._files: dict[tuple[str, str | None], VectorFile] = {}

    @property
    def files(self) -> list[VectorFile]:
        return list(self._files.values())

    def read(self, version: int) -> None:
        """Brought to ``version``: the commits after the one read, or the log anew (one
        commit gone: cleaned up since, a checkpoint holds it)."""
        if version == self.version:
            return
        if 0 <= self.version < version:
            try:
                self._follow(self._commits(self.version, version))
            except FileNotFoundError:
                pass
            else:
                return
        self._replay(version)

    def _commits(self, after: int, through: int) -> list[list[str]]:
        """The lines of every commit after ``after`` through ``through``, each asked for
        without a HEAD before it, all at once (in an object store one round trip, not one a
        commit); FileNotFoundError: one is gone."""
        names = [commit_name(at) for at in range(after + 1, through + 1)]
        return [data.decode().splitlines() for data in self.store.read_each(names)]

    def _follow(self, commits: list[list[str]]) -> None:
        for lines in commits:
            self._apply(lines)
            self.version += 1

    def applied(self, version: int, actions: list[dict[str, object]]) -> None:
        """pgsub's own commit ``version`` (its ``actions``), which follows the one read."""
        if version != self.version + 1:
            raise ValueError(f"commit {version} does not follow {self.version}")
        self._take(actions)  # as they are: no JSON written only to be read again
        self.version = version

    def _replay(self, version: int) -> None:
        """The files as of the latest checkpoint at or below ``version`` that this can read
        and that the commits after it follow on from (none: from commit 0). One listing of
        the log says which commits are there: no HEAD a commit."""
        self._files = {}
        self.version = -1
        listed = self._log_listing()
        there = {int(m[1]) for n in listed if (m := _COMMIT.fullmatch(n.rsplit("/", 1)[-1]))}
        found = self._checkpoints(listed, version)
        start = next(
            (c for c in found if there.issuperset(range(c.version + 1, version + 1))), None
        )
        if start is None and not there.issuperset(range(version + 1)):
            newest = found[0].version if found else None
            raise UnreadableLogError(
                f"{self.store.location}: no checkpoint pgsub reads (newest readable: "
                f"{newest}) is followed by every commit through version {version}"
            )
        if start is not None:
            for part in start.parts:
                self._read_checkpoint(part)
            self.version = start.version
        self._follow(self._commits(self.version, version))

    def _checkpoints(self, listed: list[str], version: int) -> list[_Checkpoint]:
        """The complete classic checkpoints among the log's files ``listed``, at or below
        ``version``, newest first; a V2 one among them is an ``UnreadableLogError``."""
        classic: dict[int, str] = {}
        parts: dict[tuple[int, int], dict[int, str]] = {}
        for name in listed:
            base = name.rsplit("/", 1)[-1]
            if match := _V2.fullmatch(base):
                if int(match[1]) <= version:
                    raise UnreadableLogError(
                        f"{self.store.location} has a V2 checkpoint ({base}), which pgsub "
                        "does not read"
                    )
            elif match := _CLASSIC.fullmatch(base):
                classic[int(match[1])] = name
            elif match := _PART.fullmatch(base):
                parts.setdefault((int(match[1]), int(match[3])), {})[int(match[2])] = name
        found = [_Checkpoint(v, [name]) for v, name in classic.items()]
        for (at, count), got in parts.items():
            if sorted(got) == list(range(1, count + 1)):  # a part missing: passed over
                found.append(_Checkpoint(at, [got[i] for i in sorted(got)]))
        return sorted((c for c in found if c.version <= version), key=lambda c: -c.version)

    def _read_checkpoint(self, part: str) -> None:
        file = pq.ParquetFile(self.store.open(part))
        if "sidecar" in file.schema_arrow.names:
            sidecars = file.read(columns=["sidecar"]).column("sidecar")
            if sidecars.null_count < len(sidecars):
                raise UnreadableLogError(
                    f"checkpoint {part} of {self.store.location} names sidecar files (a V2 "
                    "checkpoint), which pgsub does not read"
                )
        read = file.read(columns=[c for c in self._columns if c in file.schema_arrow.names])
        for add in read.column("add").to_pylist():
            if add is not None:
                self._add(add)
        self._checkpointed(read)

    def _log_listing(self) -> list[str]:
        """The log's files a replay chooses from: all of them."""
        return self.store.listed(LOG)

    def _checkpointed(self, read: pa.Table) -> None:
        """A checkpoint's ``_columns`` other than ``add``: none here."""

    def _removed(self, remove: dict[str, object]) -> None:
        """A ``remove`` action read: nothing more than the file no longer live, here."""

    def _apply(self, lines: list[str]) -> None:
        self._take(json.loads(line) for line in lines)

    def _take(self, actions: Iterable[Mapping[str, object]]) -> None:
        for action in actions:
            if isinstance(remove := action.get("remove"), dict):
                vector = remove.get("deletionVector")
                unique = Descriptor.of(vector).unique_id if isinstance(vector, dict) else None
                name = canonical(str(remove["path"]), self.store.location)
                self._files.pop((name, unique), None)
                self._removed(remove)
            elif isinstance(add := action.get("add"), dict):
                self._add(add)

    def _add(self, add: dict[str, object]) -> None:
        if add.get("partitionValues"):
            raise UnreadableLogError(f"{self.store.location} is partitioned")
        vector = add.get("deletionVector")
        path = str(add["path"])
        file = VectorFile(
            path,
            canonical(path, self.store.location),
            int(str(add["size"])),
            int(str(add["modificationTime"])),
            None if add.get("stats") is None else str(add["stats"]),
            Descriptor.of(vector) if isinstance(vector, dict) else None,
        )
        self._files[file.identity] = file


def make_durable(store: TableStore, version: int) -> None:
    """The commit ``version`` another engine made (delta-rs, Spark), durable with the files
    it adds: its data and deletion vector files, itself, and the folders naming them."""
    names: list[str] = []
    for line in store.read(commit_name(version)).decode().splitlines():
        action = json.loads(line)
        add = action.get("add") or action.get("cdc")
        if not isinstance(add, dict):
            continue
        names.append(canonical(str(add["path"]), store.location))
        vector = add.get("deletionVector")
        if isinstance(vector, dict) and vector.get("storageType") in ("u", "p"):
            names.append(Descriptor.of(vector).name)
    store.sync([*names, commit_name(version)])


def latest_version(store: TableStore) -> int:
    """The table's latest version, found from its last checkpoint without listing the log
    (which holds a commit a second for a week): the commits after it probed, doubling the
    step, then halving it. -1: no commit."""
    try:
        low = int(json.loads(store.read(f"{LOG}/_last_checkpoint"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        low = 0 if store.exists(commit_name(0)) else -1
    if low < 0:
        return -1
    step = 1
    while store.exists(commit_name(low + step)):
        low, step = low + step, step * 2
    while step > 1:  # low exists, low + step does not
        step //= 2
        if store.exists(commit_name(low + step)):
            low += step
    return low


def newest_commit(store: TableStore) -> int:
    """The table's latest version (-1: no commit), from its last checkpoint: in an object
    store one listing of the log from there (a request); on a local disk the commits after
    it probed (``latest_version``: no listing of a folder that holds a week of commits)."""
    if isinstance(store, LocalStore):
        return latest_version(store)
    try:
        checkpoint = int(json.loads(store.read(f"{LOG}/_last_checkpoint"))["version"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        checkpoint = -1
    after = commit_name(checkpoint) if checkpoint >= 0 else f"{LOG}/"
    newest = checkpoint
    for name in store.listed_after(LOG, after):
        match = _COMMIT.fullmatch(name.rsplit("/", 1)[-1])
        if match is not None and int(match[1]) == newest + 1:
            newest += 1
    return newest


def carries(store: TableStore, version: int, mark: CommitMark) -> bool:
    """Whether the table's commit ``version`` carries ``mark``'s idempotent-write id: it is
    the commit made for that mark, not another engine's made over it."""
    app_id, batch_version = mark.txn
    try:
        lines = store.read(commit_name(version)).decode().splitlines()
    except FileNotFoundError:
        return False
    for line in lines:
        txn = json.loads(line).get("txn")
        if isinstance(txn, dict) and txn.get("appId") == app_id:
            return int(txn.get("version", -1)) == batch_version
    return False
