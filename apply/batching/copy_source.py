"""A table's rows for the initial copy, as the writer of ``Tables.copy_into`` takes them.

Pure. The table-sync worker describes the rows two ways and the writer
picks the one its Spark can use: ``blocks`` reads them in this process
(threads over the ranges, with the copy's progress reported as they
come), ``parts`` and ``read`` let Spark tasks read one part each on the
executors of a cluster. ``read`` is pickled into those tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from apply.core.records import CommitMark


@dataclass(frozen=True)
class CopySource:
    blocks: Callable[[], Iterator[pa.Table]]  # every row, read here
    parts: Sequence[Any]  # the table's parts (CTID ranges), each read on its own...
    read: Callable[[Any], Iterator[pa.Table]]  # ...by this, in any process

    @classmethod
    def read_here(cls, blocks: Callable[[], Iterator[pa.Table]]) -> CopySource:
        """Rows only this process can read (the slot's own transaction): no parts."""
        return cls(blocks, (), _unreadable)

    @classmethod
    def in_memory(cls, blocks: Sequence[pa.Table]) -> CopySource:
        """Rows already in memory, as one part."""
        return cls(lambda: iter(blocks), [None], lambda _: iter(blocks))

    def watched(self, watch: Callable[[Iterator[pa.Table]], Iterator[pa.Table]]) -> CopySource:
        """The same rows, with ``watch`` wrapped around the blocks read here."""
        blocks = self.blocks
        return replace(self, blocks=lambda: watch(blocks()))


def _unreadable(part: Any) -> Iterator[pa.Table]:
    raise RuntimeError("these rows can only be read by the process that holds the snapshot")


class StagedParts(Protocol):
    """A copy's parts staged where the executors write, to resume after a crash: each
    part read by a Spark task (``read`` is pickled into it) replaces what a killed
    attempt staged under its name (``apply.delta.spark.staged_copy``)."""

    def stage(self, read: Callable[[], Iterator[pa.Table]], name: str) -> None: ...

    def land(
        self, mark: CommitMark, stale: Sequence[str], fresh: Sequence[str], keys: str | None
    ) -> tuple[int, int | None]:
        """Parts ``fresh`` whole and ``stale`` without the keys in part ``keys`` replace the
        table's rows in one commit carrying ``mark``; (rows, version)."""
        ...

    def drop(self) -> None: ...
