"""A local table's live files with their deletion vectors, as its Delta log says.

delta-rs lists a table's files but not the deletion vector each carries,
and a commit that gives a file a new vector must name the old one in its
``remove`` (Delta's protocol: a file is the pair of its path and its
vector). ``LiveFiles`` replays the log for them: the latest checkpoint (one
Parquet file, or its parts), then the JSON commits after it; after that
only the commits it has not read, and pgsub's own commits as it makes them
(``applied``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final
from urllib.parse import unquote

import pyarrow.parquet as pq

from apply.delta.deletion_vectors import Descriptor
from apply.errors import TargetTableError

_CHECKPOINT_COLUMNS: Final = ["add"]


@dataclass(frozen=True, slots=True)
class VectorFile:
    """A live data file: its ``add`` action as the log holds it."""

    path: str  # as the log names it
    size: int
    modification_time: int
    stats: str | None  # the ``add``'s statistics (JSON), as written
    vector: Descriptor | None  # the rows it deletes, if any

    @property
    def identity(self) -> tuple[str, str | None]:
        """What tells live files apart: the path and the vector (Delta's protocol)."""
        return self.path, None if self.vector is None else self.vector.unique_id

    def local(self, table: str) -> str:
        path = unquote(self.path.removeprefix("file://"))
        return path if path.startswith("/") else str(Path(table, path))

    def rows(self) -> int | None:
        """The rows the file holds (deleted ones too), from its statistics."""
        if self.stats is None:
            return None
        count = json.loads(self.stats).get("numRecords")
        return None if count is None else int(count)

    def with_vector(self, vector: Descriptor) -> VectorFile:
        return replace(self, vector=vector)


class UnreadableLogError(TargetTableError):
    """A log pgsub does not replay itself (a v2 checkpoint, a partitioned table)."""


class LiveFiles:
    """The live files of the table at the local folder ``table``, as of ``version``."""

    def __init__(self, table: str) -> None:
        self.table = table
        self._log = Path(table, "_delta_log")
        self.version = -1
        self._files: dict[tuple[str, str | None], VectorFile] = {}

    @property
    def files(self) -> list[VectorFile]:
        return list(self._files.values())

    def read(self, version: int) -> None:
        """Brought to ``version``: the commits after the one read, or the log anew."""
        if version == self.version:
            return
        commits = [self._log / f"{v:020d}.json" for v in range(self.version + 1, version + 1)]
        if self.version < 0 or not all(c.exists() for c in commits):
            self._replay_checkpoint(version)
            commits = [self._log / f"{v:020d}.json" for v in range(self.version + 1, version + 1)]
        for commit in commits:
            self._apply(commit.read_text().splitlines())
        self.version = version

    def applied(self, version: int, actions: list[dict[str, object]]) -> None:
        """pgsub's own commit ``version`` (its ``actions``), which follows the one read."""
        if version != self.version + 1:
            raise ValueError(f"commit {version} does not follow {self.version}")
        self._apply([json.dumps(a) for a in actions])
        self.version = version

    def _replay_checkpoint(self, version: int) -> None:
        """The files as of the latest checkpoint at or below ``version`` (none: commit 0)."""
        self._files = {}
        self.version = -1
        checkpoint = self._checkpoint(version)
        if checkpoint is None:
            return
        at, parts = checkpoint
        for part in parts:
            adds = pq.read_table(part, columns=_CHECKPOINT_COLUMNS).column("add")
            for add in adds.to_pylist():
                if add is not None:
                    self._add(add)
        self.version = at

    def _checkpoint(self, version: int) -> tuple[int, list[Path]] | None:
        """The latest classic checkpoint at or below ``version``: its version and files."""
        found: dict[int, list[Path]] = {}
        for file in self._log.glob("*.checkpoint*.parquet"):
            at = int(file.name.split(".", 1)[0])
            if at <= version:
                found.setdefault(at, []).append(file)
        for file in self._log.glob("*.checkpoint.*.json"):
            raise UnreadableLogError(
                f"{self.table} has a v2 checkpoint ({file.name}), which pgsub does not read"
            )
        if not found:
            return None
        at = max(found)
        parts = sorted(found[at])
        if len(parts) > 1 or ".checkpoint.parquet" not in parts[0].name:
            expected = int(parts[0].name.split(".")[-2])  # <v>.checkpoint.<i>.<n>.parquet
            if len(parts) != expected:
                raise UnreadableLogError(f"checkpoint {at} of {self.table} is incomplete")
        return at, parts

    def _apply(self, lines: list[str]) -> None:
        for line in lines:
            action = json.loads(line)
            if "remove" in action:
                remove = action["remove"]
                vector = remove.get("deletionVector")
                unique = Descriptor.of(vector).unique_id if isinstance(vector, dict) else None
                self._files.pop((str(remove["path"]), unique), None)
            elif "add" in action:
                self._add(action["add"])

    def _add(self, add: dict[str, object]) -> None:
        if add.get("partitionValues"):
            raise UnreadableLogError(f"{self.table} is partitioned")
        vector = add.get("deletionVector")
        file = VectorFile(
            str(add["path"]),
            int(str(add["size"])),
            int(str(add["modificationTime"])),
            None if add.get("stats") is None else str(add["stats"]),
            Descriptor.of(vector) if isinstance(vector, dict) else None,
        )
        self._files[file.identity] = file
