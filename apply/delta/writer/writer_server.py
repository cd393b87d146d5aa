"""Imported once by the server the writer processes are forked from (``merge_processes``).

The writer's modules are imported here, before any process is forked, so each
process starts with them instead of importing them again (``subscriber`` first, so
that pyarrow does not import pandas: subscriber/pyarrow_start.py); ``gc.freeze`` then
keeps Python's collector from writing to every object they made (it marks
each one it visits), so the pages a process shares with the server stay
shared until the process itself changes them.
"""

from __future__ import annotations

import gc

# isort: off
import subscriber  # noqa: F401 - first: pyarrow told pandas is not there (subscriber/pyarrow_start.py)
import apply.delta.writer.local_merge  # noqa: F401 - imported for the processes forked after
# isort: on

gc.freeze()
