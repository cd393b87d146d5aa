"""pyarrow as pgsub's process starts it (``subscriber/pyarrow_start.py``): pandas is not
imported by pyarrow's first ``pa.array``, nor by any of the daemon's or the writer
processes' modules, and is still there for what asks for it."""

from __future__ import annotations

import subprocess
import sys

STARTED = """
import sys
import subscriber.runtime.cli  # as `pgsub run` starts
import apply.delta.tables, apply.delta.writer.writer_server, subscriber.runtime.subscription
import pyarrow as pa

print("imported" if "pandas" in sys.modules else "absent")
print(pa.array([1, 2, None]).null_count)
frame = pa.table({"id": [1, 2]}).to_pandas()  # what needs pandas imports it
print(type(frame).__name__, "imported" if "pandas" in sys.modules else "absent")
print(pa.Table.from_pandas(frame).num_rows)
"""

ANOTHER_THREAD = """
import sys, threading
import pyarrow as pa
from subscriber.pyarrow_start import _PandasRefused

refused = _PandasRefused()
sys.meta_path.insert(0, refused)
imported = []
thread = threading.Thread(target=lambda: imported.append(__import__("pandas").__name__))
thread.start()
thread.join()
sys.meta_path.remove(refused)
print(imported)
"""


def _run(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout.split("\n")


def test_the_daemons_modules_leave_pandas_to_what_uses_it() -> None:
    absent, nulls, converted, pandas_rows = _run(STARTED)[:4]
    assert absent == "absent"  # 41 MB and 0.2 s of every start, before
    assert nulls == "1"
    assert converted == "DataFrame imported"
    assert pandas_rows == "2"


def test_pandas_is_refused_only_to_the_thread_that_asks_pyarrow() -> None:
    assert _run(ANOTHER_THREAD)[0] == "['pandas']"
