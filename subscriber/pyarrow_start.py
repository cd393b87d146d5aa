"""pyarrow started without pandas: pandas is imported by what uses it, not by every process.

pyarrow asks, at its first ``pa.array`` of a Python list, whether the list is a
pandas object, and imports pandas to tell (41 MB of the daemon's memory and 0.2
s of its start; the same again in the server its writer processes are forked
from). pgsub's own code never makes a pandas object; PySpark imports pandas
itself where it needs it (as its session starts, and in ``createDataFrame``).
So pgsub tells pyarrow, once, before its first Arrow call, that pandas is not
there: the import it tries is refused, in its own thread only, while it tries.

When pandas is imported later: ``to_pandas`` and ``pa.Table.from_pandas`` make
pyarrow import it and use it from then on; before either, ``pa.array`` and
``pa.Array.from_pandas`` take a pandas object (pgsub makes none) as the sequence
of values it is, not through pandas (docs/performance.md, "pandas left to what
uses it").
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType


class _PandasRefused(MetaPathFinder):
    """Refuses ``import pandas`` in the thread that made it, while pyarrow asks."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "pandas" and threading.get_ident() == self.thread:
            raise ImportError("pandas is imported by what uses it (subscriber/pyarrow_start.py)")
        return None


def without_pandas() -> None:
    """pyarrow told that pandas is not there, unless it is imported already."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    refused = _PandasRefused()
    sys.meta_path.insert(0, refused)
    try:
        pa.array([0])  # pyarrow asks here, once, and remembers the answer
    finally:
        sys.meta_path.remove(refused)
