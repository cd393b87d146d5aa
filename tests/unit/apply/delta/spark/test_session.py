"""The session configuration is pure; jars come from a folder, never a download."""

import os
from pathlib import Path
from typing import Any

import pytest

from apply.delta.spark.session import (
    LazySession,
    SparkSettings,
    SparkSetupError,
    delta_jars,
    is_remote,
    runs_here,
    session_conf,
    spark_master,
    started,
    stop_sessions,
    thread_session,
)


def make_jars(folder: Path) -> Path:
    folder.mkdir()
    for name in ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"):
        (folder / name).write_bytes(b"")
    return folder


def test_local_session_points_spark_at_the_jars(tmp_path: Path) -> None:
    """A local JVM starts with them on its class path (not copied into its scratch at each
    start, as spark.jars is); a cluster's executors fetch them (spark.jars); a user's
    class path comes after them, a user's spark.jars replaces them."""
    folder = make_jars(tmp_path / "lib")
    jars = [str(p) for p in sorted(folder.glob("*.jar"))]
    conf = session_conf(SparkSettings(master="local[2]"), folder)
    assert conf["spark.driver.extraClassPath"].split(os.pathsep) == jars
    assert "spark.jars" not in conf and "spark.jars.packages" not in conf
    cluster = session_conf(SparkSettings(master="spark://m:7077"), folder)
    assert cluster["spark.jars"].split(",") == jars and "spark.driver.extraClassPath" not in cluster
    mine = {"spark.driver.extraClassPath": "/opt/mine.jar"}
    added = session_conf(SparkSettings(master="local[2]", conf=mine), folder)
    assert added["spark.driver.extraClassPath"].split(os.pathsep) == [*jars, "/opt/mine.jar"]
    own = {"spark.jars": "/opt/delta.jar", **mine}
    replaced = session_conf(SparkSettings(master="local[2]", conf=own), folder)
    assert replaced["spark.jars"] == "/opt/delta.jar"
    assert replaced["spark.driver.extraClassPath"] == "/opt/mine.jar"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.session.timeZone"] == "UTC"


def test_user_conf_wins(tmp_path: Path) -> None:
    folder = make_jars(tmp_path / "lib")
    conf = session_conf(
        SparkSettings(master="local[2]", conf={"spark.sql.shuffle.partitions": "64"}), folder
    )
    assert conf["spark.sql.shuffle.partitions"] == "64"


def test_remote_session_needs_no_local_jars(tmp_path: Path) -> None:
    conf = session_conf(SparkSettings(remote="sc://spark:15002"), tmp_path / "absent")
    assert "spark.jars" not in conf


def test_missing_jars_say_how_to_get_them(tmp_path: Path) -> None:
    with pytest.raises(SparkSetupError, match="make jars"):
        delta_jars(tmp_path / "absent")


def test_jvm_stack_traces_are_logged_only_at_debug(tmp_path: Path) -> None:
    folder = make_jars(tmp_path / "lib")
    quiet = session_conf(SparkSettings(master="local[2]"), folder)["spark.driver.extraJavaOptions"]
    loud = session_conf(SparkSettings(master="local[2]", jvm_traces=True), folder)
    config = Path(quiet.split("-Dlog4j2.configurationFile=")[1].split()[0])
    assert config.is_file() and "alwaysWriteExceptions" in config.read_text()
    assert "-Dpgsub.jvm.traces=false" in quiet
    assert "-Dpgsub.jvm.traces=true" in loud["spark.driver.extraJavaOptions"]


def test_the_jvms_scratch_is_the_folder_given(tmp_path: Path) -> None:
    """The process's own folder (``process_scratch``, removed after a crash by the next
    start) holds the local JVM's temp files, Spark's local dir and S3A's buffers; a
    cluster's executors keep their own local dirs and buffer under the temp dir's path."""
    import tempfile

    folder = make_jars(tmp_path / "lib")
    scratch = tmp_path / "scratch"
    local = session_conf(SparkSettings(master="local[2]"), folder, scratch)
    assert f"-Djava.io.tmpdir={scratch}" in local["spark.driver.extraJavaOptions"]
    assert local["spark.local.dir"] == str(scratch)
    assert local["spark.hadoop.fs.s3a.buffer.dir"] == str(scratch / "s3a")
    cluster = session_conf(SparkSettings(master="spark://m:7077"), folder, scratch)
    assert f"-Djava.io.tmpdir={scratch}" in cluster["spark.driver.extraJavaOptions"]
    assert "spark.local.dir" not in cluster
    buffers = Path(tempfile.gettempdir()) / "pgsub-s3a"
    assert cluster["spark.hadoop.fs.s3a.buffer.dir"] == str(buffers)
    remote = session_conf(SparkSettings(remote="sc://spark:15002"), tmp_path / "absent")
    assert not any("buffer.dir" in key or "local.dir" in key for key in remote)


def test_a_spark_connect_token_never_reaches_the_log() -> None:
    from apply.delta.spark.session import masked_spark_url

    url = "sc://spark.example:443/;use_ssl=true;token=dapi-s3cr3t;user_id=pgsub"
    assert masked_spark_url(url) == "sc://spark.example:443/;use_ssl=true;token=***;user_id=pgsub"
    assert masked_spark_url("local[*]") == "local[*]"


def test_sparks_python_tasks_run_this_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PySpark's default is the first `python3` on PATH, which lacks pgsub's packages: the
    copy's range readers failed with "No module named 'pyarrow'" on a cluster, and a
    staged copy's tasks on a local master under a plain PATH."""
    import sys

    folder = make_jars(tmp_path / "lib")
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    cluster = session_conf(SparkSettings(master="spark://m:7077"), folder)
    assert cluster["spark.pyspark.python"] == sys.executable
    local = session_conf(SparkSettings(master="local[2]"), folder)
    assert local["spark.pyspark.python"] == sys.executable
    chosen = SparkSettings(master="spark://m:7077", conf={"spark.pyspark.python": "/opt/py"})
    assert session_conf(chosen, folder)["spark.pyspark.python"] == "/opt/py"


def test_a_spark_connect_session_is_told_apart_and_its_thread_sessions_are_released() -> None:
    """No server is needed: a Spark Connect client connects on its first call."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    client: Any = ConnectSession(connection="sc://127.0.0.1:9")
    try:
        assert is_remote(client)
        assert spark_master(client) == "" and not runs_here(client)
        own: Any = thread_session(client)
        assert is_remote(own) and own is not client
        assert own.session_id != client.session_id  # its own conf and temporary views
    finally:
        stop_sessions()  # at once, though no server answers
        client.release_session_on_close = False
        client.stop()
    assert own.is_stopped


class _Session:
    """What a started session answers here: its master, and a session for a thread."""

    def __init__(self, name: str = "root") -> None:
        self.name = name

    def newSession(self) -> "_Session":
        return _Session(f"{self.name}/thread")


def test_a_lazy_session_starts_at_its_first_use_not_when_described() -> None:
    builds: list[int] = []

    def build() -> Any:
        builds.append(1)
        return _Session()

    lazy: Any = LazySession(build, master="local[2]", remote=False)
    # what the daemon's wiring asks of it at start: answered from the settings
    assert not is_remote(lazy) and spark_master(lazy) == "local[2]" and runs_here(lazy)
    child: Any = thread_session(lazy)
    assert not started(lazy) and not started(child) and builds == []
    assert child.name == "root/thread"  # a thread's session, of the one started now
    assert started(lazy) and started(child) and builds == [1]
    assert lazy.name == "root" and builds == [1]


def test_a_lazy_session_is_started_once_whatever_the_threads() -> None:
    import threading
    import time

    builds: list[int] = []

    def build() -> Any:
        builds.append(1)
        time.sleep(0.2)  # a JVM starting: the other threads ask meanwhile
        return _Session()

    lazy: Any = LazySession(build, master="", remote=True)
    assert is_remote(lazy) and spark_master(lazy) == ""
    names: list[str] = []
    threads = [threading.Thread(target=lambda: names.append(lazy.name)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert names == ["root"] * 8 and builds == [1]
