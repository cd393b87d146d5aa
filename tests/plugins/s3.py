"""An object store for the tests: versitygw, a real S3 gateway, over a temporary folder.

versitygw (``make tools`` builds it from the Go module proxy) speaks the S3 API
the three engines use - conditional PUTs (``If-None-Match``, refused with 412),
multipart uploads, ranged GETs, ListObjectsV2 - and checks signatures, so a
wrong key is refused as AWS refuses it. One server per test process, on a free
loopback port, always stopped after the run (its own process group); a bucket
per test (``s3_warehouse``), so tests never see each other's tables.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from apply.delta.files import storage
from apply.delta.files.storage import Storage, register
from tests.support.pgcluster import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
ACCESS_KEY, SECRET_KEY = "pgsub-tests", "pgsub-tests-secret"


def versitygw() -> str | None:
    found = ROOT / ".tools" / "bin" / "versitygw"
    return str(found) if found.exists() else shutil.which("versitygw")


@dataclass
class S3Server:
    """A running versitygw: its endpoint, its root folder (a folder a bucket), its keys."""

    endpoint: str
    root: Path
    process: subprocess.Popen[bytes]

    def storage(self, *, secret: str = SECRET_KEY) -> Storage:
        return Storage(
            endpoint=self.endpoint,
            region="us-east-1",
            path_style=True,
            access_key_id=ACCESS_KEY,
            secret_access_key=secret,
        )

    def config(self) -> dict[str, Any]:
        """The ``storage`` section of a daemon's config (the keys from the environment)."""
        return {"endpoint": self.endpoint, "region": "us-east-1", "path_style": True}

    def environment(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def bucket(self, name: str) -> str:
        """A new empty bucket (the gateway's posix backend: a folder of its root)."""
        (self.root / name).mkdir()
        return name


def start_s3_server(
    root: Path, access_log: Path | None = None, *, host: str = "127.0.0.1"
) -> S3Server:
    """versitygw over ``root``, listening on ``host`` (``0.0.0.0``: also where a cluster's
    pods reach the machine), its endpoint on the loopback."""
    binary = versitygw()
    if binary is None:
        raise RuntimeError("versitygw is not built: run `make tools`")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (root.parent / f"versitygw-{port}.log").open("w")
    logging = ["--access-log", str(access_log)] if access_log is not None else []
    process = subprocess.Popen(
        [binary, "--port", f"{host}:{port}", *logging, "posix", str(root)],
        env={**os.environ, "ROOT_ACCESS_KEY": ACCESS_KEY, "ROOT_SECRET_KEY": SECRET_KEY},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = S3Server(f"http://127.0.0.1:{port}", root, process)

    def answers() -> bool:
        import socket

        if process.poll() is not None:
            raise RuntimeError(f"versitygw exited: {(root.parent / log.name).read_text()[-500:]}")
        with contextlib.closing(socket.socket()) as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_until(answers, timeout=30, what="versitygw to listen")
    return server


def logged_requests(access_log: Path) -> list[tuple[str, str]]:
    """Every request versitygw answered so far, as (operation, object key), oldest first:
    ``("PutObject", "wh/t/_delta_log/00000000000000000001.json")``; a listing's key is
    its prefix."""
    from urllib.parse import unquote

    found = []
    for line in access_log.read_text().splitlines():
        fields = line.split("] ", 1)[-1].split()
        if len(fields) < 6 or not fields[3].startswith("s3_"):
            continue
        key = fields[4]
        if key == "-":  # a listing: its prefix
            key = unquote(fields[5].partition("prefix=")[2].partition("&")[0])
        found.append((fields[3].removeprefix("s3_"), key))
    return found


def object_kind(key: str) -> str:
    """What a request's object is: pgsub's ``state``, a table's ``commit``, ``checkpoint``,
    other ``log`` file or ``log listing``, a ``deletion vector``, ``data``, or ``other``."""
    if "/_pgsub/" in key or key.startswith("_pgsub"):
        return "state"
    if "_delta_log/" in key:
        name = key.rpartition("/")[2]
        if name.endswith(".json"):
            return "commit"
        if "checkpoint" in name:
            return "checkpoint"
        return "log" if name else "log listing"
    if key.endswith(".bin"):
        return "deletion vector"
    return "data" if key.endswith(".parquet") else "other"


def stop_s3_server(server: S3Server) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_s3_server(tmp_path_factory.mktemp("s3") / "root")
    try:
        yield server
    finally:
        stop_s3_server(server)


def configure_spark(spark: Any, store: Storage) -> None:
    """This process's Spark told how to reach ``store`` (its Hadoop configuration is read
    when a bucket's file system is first made: set before any path of it is read)."""
    hadoop = spark._jsc.hadoopConfiguration()
    for key, value in store.spark_conf().items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key.removeprefix("spark.hadoop."), value)
        else:
            spark.conf.set(key, value)


@contextlib.contextmanager
def bucket_warehouse(server: S3Server, request: pytest.FixtureRequest) -> Iterator[str]:
    """An ``s3a://`` warehouse in a new bucket of ``server`` named for the test, registered
    in this process (and given to this process's Spark when the test uses it)."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    bucket = server.bucket(f"{name}-{int(time.time() * 1000) % 10**9}")
    warehouse = f"s3a://{bucket}/wh"
    register(warehouse, server.storage())
    if "spark" in request.fixturenames:
        configure_spark(request.getfixturevalue("spark"), server.storage())
    try:
        yield warehouse
    finally:
        with storage._LOCK:
            storage._REGISTERED.pop(warehouse, None)


@pytest.fixture
def s3_warehouse(s3_server: S3Server, request: pytest.FixtureRequest) -> Iterator[str]:
    """An ``s3a://`` warehouse in a bucket of its own (``bucket_warehouse``)."""
    with bucket_warehouse(s3_server, request) as warehouse:
        yield warehouse
