"""``spark_errors``: what an ``except`` around a Spark call catches - nothing before pyspark
is imported, PySpark's and py4j's errors after - and the daemon's modules import none of
pyspark (a daemon that starts no JVM never needs it)."""

from __future__ import annotations

import subprocess
import sys

SPARK_ERRORS = """
import sys
import subscriber.runtime.cli  # as `pgsub run` starts
import apply.delta.tables, apply.delta.copy, apply.delta.state_store, apply.delta.tables_state
import apply.delta.writer.writer_server, subscriber.runtime.subscription
import subscriber.runtime.daemon, subscriber.runtime.maintenance
from apply.delta.spark.session import spark_errors

print("imported" if "pyspark" in sys.modules else "absent", spark_errors())
from py4j.protocol import Py4JNetworkError
from pyspark.errors import AnalysisException

caught = []
for error in (AnalysisException("no such table"), Py4JNetworkError("the JVM went away")):
    try:
        raise error
    except spark_errors() as exc:
        caught.append(type(exc).__name__)
try:
    try:
        raise ValueError("not Spark's")
    except spark_errors():
        caught.append("ValueError")
except ValueError:
    caught.append("passed on")
print(caught)
"""


def test_the_daemons_modules_leave_pyspark_out_and_spark_errors_follow_its_import() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SPARK_ERRORS],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    before, caught = done.stdout.splitlines()[:2]
    assert before == "absent ()"
    assert caught == "['AnalysisException', 'Py4JNetworkError', 'passed on']"
