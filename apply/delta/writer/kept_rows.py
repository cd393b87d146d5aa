"""The rows of the small files this process just wrote, kept for the batch that reads them.

pgsub's own writer reads back files it wrote itself a few batches before: a
small table's one file at its next rewrite (``local_merge``), a keyed
table's small batch files when a batch folds them (``vector_write``). On a
local disk that read is a page-cache hit; in an object store each file is
a HEAD and two GETs, one after the other - 57 requests for a fold of 19
files, and the batch waits for each. A Parquet file never changes once
written, so its rows, kept by its name, are its rows for as long as it
lives: reading them from here is reading the file.

Kept within ``BUDGET`` bytes of Arrow for the whole process, the least
recently used dropped first, and a file dropped at once when a commit
removes it from its table (``forget``); a file not kept is read from the
store as before. Its writers keep one chunk per file: rows concatenated
batch after batch would be a chunk a batch. A file's name is never used
again (a UUID in it), so nothing kept is ever stale: a table made anew has
other files.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

import pyarrow as pa

# The Arrow bytes kept for every table of the process together.
BUDGET: Final = 64 * 2**20
# A file of more rows' bytes than this is not kept (a larger file is not read back soon).
LARGEST: Final = 4 * 2**20


class KeptRows:
    """Rows of written files by (table location, file name), least recently used first."""

    def __init__(self, budget: int = BUDGET) -> None:
        self.budget = budget
        self._rows: OrderedDict[tuple[str, str], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def keep(self, location: str, name: str, rows: pa.Table) -> None:
        """``rows`` are every row of the file ``name`` of the table at ``location``."""
        size = rows.nbytes
        if size > min(LARGEST, self.budget):
            return
        with self._lock:
            self._drop((location, name))
            self._rows[(location, name)] = rows
            self._bytes += size
            while self._bytes > self.budget:
                _, dropped = self._rows.popitem(last=False)
                self._bytes -= dropped.nbytes

    def forget(self, location: str, names: Iterable[str]) -> None:
        """The files ``names`` left the table at ``location`` (a rewrite, a fold replaced
        them): no batch reads them again, so their rows make room at once rather than wait
        to be the least recently used (a table rewritten every batch would otherwise hold
        a copy per batch until the budget is full)."""
        with self._lock:
            for name in names:
                self._drop((location, name))

    def get(self, location: str, name: str) -> pa.Table | None:
        """Every row of the file ``name``, if kept."""
        with self._lock:
            rows = self._rows.get((location, name))
            if rows is not None:
                self._rows.move_to_end((location, name))
            return rows

    def _drop(self, key: tuple[str, str]) -> None:
        rows = self._rows.pop(key, None)
        if rows is not None:
            self._bytes -= rows.nbytes

    @property
    def bytes(self) -> int:
        return self._bytes


# The process's one store of kept rows (pgsub's own writer's, every table's).
KEPT: Final = KeptRows()
