"""Builds the daemon's one Spark session, wired for Delta Lake.

``apply.delta`` is the only package that imports pyspark (docs/architecture.md);
the process holds the session as ``apply.delta.spark.session.SparkSession``.
The Delta jars are resolved by Maven at set-up time (``make jars``) into a
local folder, so that starting a session never downloads anything: a
local session's JVM starts with them on its class path, a cluster's
application carries them to its executors (``spark.jars``). A Spark Connect
server (``sc://``) carries its own jars and needs none of this.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException

from apply.delta.spark.scratch import process_scratch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql import SparkSession as SparkSession  # noqa: PLC0414 - a re-export
    from pyspark.sql.types import StructType

log = structlog.get_logger(__name__)

JARS_DIR_ENV = "PGSUB_JARS_DIR"
_LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
_REPO_JARS_DIR = Path(__file__).resolve().parents[3] / "jars" / "lib"

# Settings every pgsub session needs; the user's spark.conf overrides them.
_DELTA_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Timestamps travel as UTC instants; the JVM's zone must not shift them.
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

# Small-batch tuning for a local session: a replication batch is small, and
# the defaults (200 shuffle partitions, 50 partitions to rebuild a Delta
# snapshot) spend most of a MERGE scheduling empty tasks.
_LOCAL_CONF: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


_CLASS_PATH = "spark.driver.extraClassPath"

# What a failing Spark or Delta call raises, in the driver (PySpark) or from the JVM (py4j).
SparkErrors = (PySparkException, Py4JError)


class SparkSetupError(RuntimeError):
    """The Spark session cannot be built as configured."""


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """What the ``spark`` section of the config says."""

    master: str = "local[*]"
    remote: str | None = None
    conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "pgsub"
    jvm_traces: bool = False  # Java stack traces in the JVM's log (pgsub's log level debug)


def delta_jars(jars_dir: Path | None = None) -> list[Path]:
    """The Delta jars to hand to Spark, from ``PGSUB_JARS_DIR`` or jars/lib."""
    folder = jars_dir or Path(os.environ.get(JARS_DIR_ENV) or _REPO_JARS_DIR)
    jars = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any(j.name.startswith("delta-spark_") for j in jars):
        raise SparkSetupError(
            f"no Delta jars in {folder}: run `make jars` (Maven resolves them into "
            f"jars/lib) or set {JARS_DIR_ENV} to a folder holding delta-spark and "
            "delta-storage"
        )
    return jars


def session_conf(
    settings: SparkSettings, jars_dir: Path | None = None, scratch: Path | None = None
) -> dict[str, str]:
    """The full Spark configuration for ``settings`` (pure apart from the jar lookup), the
    driver JVM's scratch in ``scratch`` (``process_scratch()``'s; Python's temp dir when
    none is given)."""
    conf: dict[str, str] = dict(_DELTA_CONF)
    local = settings.remote is None and settings.master.startswith("local")
    if local:
        conf.update(_LOCAL_CONF)
    if settings.remote is None:
        # The driver JVM's logging: one line per event, stack traces only when asked for.
        traces, tasks = ("true", "warn") if settings.jvm_traces else ("false", "error")
        # The JVM's scratch under Python's temp dir (TMPDIR), not a fixed /tmp: the chart's
        # pod has a read-only root filesystem with TMPDIR on its spool volume.
        temp = Path(tempfile.gettempdir())
        scratch = scratch or temp
        conf["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={_LOG4J_CONFIG} -Dpgsub.jvm.traces={traces} "
            f"-Dpgsub.jvm.task_failures={tasks} -Djava.io.tmpdir={scratch}"
        )
        # S3A buffers what it uploads in files there, not under Hadoop's /tmp. A cluster's
        # executors upload and set their own local dirs: the temp dir's path, not the
        # driver's folder.
        buffers = scratch / "s3a" if local else temp / "pgsub-s3a"
        conf["spark.hadoop.fs.s3a.buffer.dir"] = str(buffers)
        if local:
            conf["spark.local.dir"] = str(scratch)
        if "PYSPARK_PYTHON" not in os.environ:
            # The Python of Spark's Python tasks (the initial copy's range readers): this
            # one - on a cluster at the same path on the executors (the chart's image is
            # theirs too) - not PySpark's default of whatever `python3` is first on PATH,
            # which may lack pyarrow.
            conf["spark.pyspark.python"] = sys.executable
    chosen = dict(settings.conf)  # the user's, over pgsub's
    if settings.remote is None and "spark.jars" not in chosen:
        jars = [str(j) for j in delta_jars(jars_dir)]
        if local:
            # One JVM is driver and executor: the jars on its class path as it starts, not
            # in spark.jars, which a local executor copies (73 MB with S3A's SDK) into its
            # scratch at every start before loading them (about 0.7 s more to every JVM
            # start, docs/performance.md). A class path of the user's comes after them.
            theirs = chosen.pop(_CLASS_PATH, None)
            conf[_CLASS_PATH] = os.pathsep.join([*jars, theirs] if theirs else jars)
        else:
            conf["spark.jars"] = ",".join(jars)  # the executors fetch them from the driver
    conf.update(chosen)
    return conf


def build_session(settings: SparkSettings, jars_dir: Path | None = None) -> SparkSession:
    """Start (or join) the process's Spark session with Delta enabled."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(settings.app_name)
    if settings.remote is not None:
        builder = builder.remote(settings.remote)
    else:
        builder = builder.master(settings.master)
    scratch = process_scratch() if settings.remote is None else None
    conf = session_conf(settings, jars_dir, scratch)
    for key, value in conf.items():
        builder = builder.config(key, value)
    python = conf.get("spark.pyspark.python")
    if python and "PYSPARK_PYTHON" not in os.environ:
        # PySpark takes the tasks' Python from this variable, not from the conf.
        os.environ["PYSPARK_PYTHON"] = python
    session = builder.getOrCreate()
    if settings.remote is None:
        session.sparkContext.setLogLevel("WARN")
    else:
        _opened(session)
    return session


class LazySession:
    """A Spark session started the first time something uses it, not before.

    The daemon holds one (``lazy_session``) where it held a started session:
    its small tables' copies and batches, the state store and the table
    checks run without Spark, so a JVM (about 7 s and 300 MB on two cores)
    is started only once something needs one - a large table's copy or
    MERGE, a schema change Spark makes, maintenance's first round - and
    the tables are copied and caught up meanwhile. Any attribute of the
    session starts it (once, whatever the thread) and is the session's;
    ``is_remote``, ``spark_master`` and ``thread_session`` answer without
    starting it.
    """

    def __init__(self, build: Callable[[], SparkSession], *, master: str, remote: bool) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._session: SparkSession | None = None
        self.master = master  # "" for Spark Connect
        self.remote = remote
        self.failure: Exception | None = None  # why the session could not start, if it did not

    @property
    def started(self) -> bool:
        return self._session is not None

    def session(self) -> SparkSession:
        """The session, started now if it is not yet."""
        if self._session is None:
            with self._lock:
                if self._session is None:
                    try:
                        self._session = self._build()
                    except Exception as exc:
                        self.failure = exc  # the daemon sees it and exits (``start_failure``)
                        raise SparkSetupError(f"the Spark session could not start: {exc}") from exc
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session(), name)


def lazy_session(settings: SparkSettings) -> SparkSession:
    """The process's session as ``build_session`` makes it, started when first used
    (``LazySession``); a bad setting still fails at once (``session_conf``)."""
    session_conf(settings)  # the jars are there, the settings are whole: checked now
    if settings.remote is None:
        process_scratch()  # killed processes' scratch removed at start, not at the JVM's

    def build() -> SparkSession:
        started = time.monotonic()
        first = threading.current_thread().name
        session = build_session(settings)
        log.info(
            "spark session started",
            first_needed_by=first,
            seconds=round(time.monotonic() - started, 3),
        )
        return session

    lazy = LazySession(
        build,
        master="" if settings.remote is not None else settings.master,
        remote=settings.remote is not None,
    )
    return cast("SparkSession", lazy)


def start_failure(session: SparkSession) -> Exception | None:
    """Why ``session`` (a ``LazySession``) could not start, if it was asked to and did not."""
    return session.failure if isinstance(session, LazySession) else None


def started(session: SparkSession) -> bool:
    """Whether ``session``'s Spark runs (a ``LazySession`` not yet used does not)."""
    return not isinstance(session, LazySession) or session.started


def arrow_frame(session: SparkSession, table: pa.Table, ddl: str) -> DataFrame:
    """``table`` as a Spark DataFrame of schema ``ddl``: the one way Arrow data enters Spark.

    PySpark (4.2) reads an Arrow table's record batches as a stream that
    ends at the first empty batch, so every row after an empty chunk is
    silently dropped (``concat_tables`` of an empty and a non-empty table
    makes one). Empty batches are left out here, before Spark sees them.
    """
    import pyarrow as pa

    batches = table.to_batches()
    if any(batch.num_rows == 0 for batch in batches):
        kept = [batch for batch in batches if batch.num_rows]
        table = pa.Table.from_batches(kept, schema=table.schema)
    return session.createDataFrame(table, schema=ddl)


def is_remote(session: SparkSession) -> bool:
    """Whether ``session`` is a Spark Connect client (``spark.remote``)."""
    if isinstance(session, LazySession):
        return session.remote
    return type(session).__module__.startswith("pyspark.sql.connect")


def spark_master(session: SparkSession) -> str:
    """The session's master (``local[*]``, ``spark://...``); "" for Spark Connect."""
    if is_remote(session):
        return ""
    if isinstance(session, LazySession):
        return session.master
    try:
        return str(session.conf.get("spark.master", ""))
    except SparkErrors:
        return ""


def runs_here(session: SparkSession) -> bool:
    """Whether the session's Spark runs in this process (``local[*]``): its tasks see this
    machine's disk (the spool, staged files)."""
    return spark_master(session).startswith("local")


_connect_sessions: list[SparkSession] = []
_connect_lock = threading.Lock()


def thread_session(spark: SparkSession) -> SparkSession:
    """A session for one thread: the same Spark, its own SQL conf and temporary views.

    Classic: ``newSession`` (the same SparkContext). Spark Connect: a new
    server-side session on its own channel, stopped by ``stop_sessions``. Of a
    ``LazySession`` not yet started: one started with it, when first used.
    """
    if isinstance(spark, LazySession):
        parent = spark
        return cast(
            "SparkSession",
            LazySession(
                lambda: thread_session(parent.session()),
                master=parent.master,
                remote=parent.remote,
            ),
        )
    if not is_remote(spark):
        return spark.newSession()
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    # The same server and channel settings (token, TLS), its own server-side session id.
    channel = spark._client._builder  # type: ignore[attr-defined]
    session = cast("SparkSession", ConnectSession(connection=channel))
    _opened(session)
    return session


def _opened(session: SparkSession) -> None:
    with _connect_lock:
        _connect_sessions.append(session)


def stop_sessions() -> None:
    """Release this process's Spark Connect sessions (``build_session``'s and
    ``thread_session``'s): one left open blocks the interpreter's exit in gRPC's channel
    close. Classic sessions are left alone (their JVM ends with the process)."""
    with _connect_lock:
        sessions, _connect_sessions[:] = list(reversed(_connect_sessions)), []
    for session in sessions:
        # One attempt: a server that is gone has nothing to release, and the client's
        # default policy would retry for minutes before the process could exit.
        session.client.set_retry_policies([])
        with contextlib.suppress(Exception):
            session.stop()


def masked_spark_url(url: str) -> str:
    """``url`` fit for a log: a Spark Connect URL's token (``;token=...``) is masked."""
    return re.sub(r"(;\s*token\s*=)[^;]*", r"\1***", url, flags=re.IGNORECASE)


def struct(ddl: str) -> StructType:
    """A Spark schema from its DDL (``a int, b string``)."""
    from pyspark.sql.types import StructType

    return cast("StructType", StructType.fromDDL(ddl))
