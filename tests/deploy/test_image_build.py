"""deploy/Dockerfile built with a real engine, and the image replicating a real publisher.

The engine and the image: tests/plugins/docker.py. The container runs the way the
chart runs it: non-root, read-only root filesystem, the spool (TMPDIR) on a
writable volume, the warehouse on another, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import deltalake
import pytest
import yaml

from tests.plugins.docker import Docker
from tests.support.pgcluster import free_port, wait_until
from tests.support.pgdatabase import PgDatabase

pytestmark = pytest.mark.e2e

POD_UID = 10001


def test_the_image_answers_help_as_its_non_root_user(docker: Docker, image: str) -> None:
    out = docker.ok("run", "--rm", image, "--help", timeout=120)
    assert "usage: pgsub" in out and "run" in out
    user = docker.ok("run", "--rm", "--entrypoint", "id", image, "-u", timeout=120)
    assert user.strip() == str(POD_UID)


# Run in the image as its user: the modules a daemon loads, and the source files Python had to
# compile to load them (none: their bytecode was written at build).
COMPILED_AT_IMPORT = """
import importlib.machinery, json
compiled = []
compile_source = importlib.machinery.SourceFileLoader.source_to_code
def counting(self, data, path, *args, **kwargs):
    compiled.append(path)
    return compile_source(self, data, path, *args, **kwargs)
importlib.machinery.SourceFileLoader.source_to_code = counting
import subscriber.runtime.cli, subscriber.runtime.daemon, apply.delta.tables
import tablesync, conflicts, deltalake, pyarrow.parquet, pyspark.sql
print(json.dumps(compiled))
"""


def test_the_image_starts_without_compiling_python(docker: Docker, image: str) -> None:
    """Its bytecode is built with it: a pod's user cannot write it, so a module without it
    is compiled again at every start (seconds of a cold start)."""
    out = docker.ok(
        "run", "--rm", "--read-only", "--entrypoint", "python", image, "-c", COMPILED_AT_IMPORT,
        timeout=120,
    )  # fmt: skip
    compiled = json.loads(out.strip().splitlines()[-1])
    assert compiled == [], f"{len(compiled)} modules compiled at start, e.g. {compiled[:5]}"


@contextlib.contextmanager
def container(docker: Docker, *args: str) -> Iterator[str]:
    name = f"pgsub-test-{uuid.uuid4().hex[:8]}"
    docker.ok("run", "-d", "--name", name, *args, timeout=120)
    try:
        yield name
    finally:
        docker("rm", "-f", name, timeout=120)


def delta_rows(path: Path) -> dict[int, str]:
    try:
        rows = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    except (deltalake.exceptions.TableNotFoundError, OSError):
        return {}
    return {r["id"]: r["v"] for r in rows}


def test_the_image_replicates_like_the_charts_pod(
    docker: Docker, image: str, publisher: PgDatabase, tmp_path: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);"
        "INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 100) g;"
        "CREATE PUBLICATION pub FOR TABLE t"
    )
    etc, warehouse = tmp_path / "etc", tmp_path / "warehouse"
    etc.mkdir()
    warehouse.mkdir()
    os.chown(warehouse, POD_UID, POD_UID)  # the pod's fsGroup does this on Kubernetes
    port = free_port()
    config = {
        "warehouse": "/data",
        "spark": {"master": "local[2]"},
        "metrics": {"host": "127.0.0.1", "port": port},
        "log": {"format": "json", "level": "info"},
        "subscriptions": [
            {
                "name": "sub1",
                "connection": publisher.dsn,
                "publications": ["pub"],
                "copy_data": True,
                "status_interval": "1s",
            }
        ],
    }
    (etc / "pgsub.yaml").write_text(yaml.safe_dump(config))
    table = warehouse / "public" / "t"
    with container(
        docker,
        "--network", "host", "--read-only",
        # exec: an emptyDir allows it; the JVM loads native libraries (snappy) from TMPDIR.
        "--tmpfs", f"/var/lib/pgsub:exec,uid={POD_UID},gid={POD_UID},mode=0700",
        "-v", f"{etc}:/etc/pgsub:ro", "-v", f"{warehouse}:/data",
        image,
    ) as name:  # fmt: skip

        def logs() -> str:
            done = docker("logs", name, timeout=60)
            return (done.stdout + done.stderr)[-4000:]

        def wait(rows: dict[int, str], timeout: float, what: str) -> None:
            try:
                wait_until(lambda: delta_rows(table) == rows, timeout, interval=1, what=what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; the container's log:\n{logs()}") from None

        copied = {i: "copied" for i in range(1, 101)}
        wait(copied, 300, "the copy")
        publisher.execute("INSERT INTO t SELECT g, 'streamed' FROM generate_series(101, 150) g")
        publisher.execute("UPDATE t SET v = 'updated' WHERE id <= 10")
        expected = {
            i: "updated" if i <= 10 else "copied" if i <= 100 else "streamed" for i in range(1, 151)
        }
        wait(expected, 180, "the streamed changes")
        assert docker.ok("exec", name, "id", "-u").strip() == str(POD_UID)
        started = time.monotonic()
        docker.ok("stop", "--time", "60", name, timeout=120)  # SIGTERM through tini
        assert time.monotonic() - started < 60, "pgsub did not stop on SIGTERM"
        code = docker.ok("inspect", "--format", "{{.State.ExitCode}}", name).strip()
        assert code == "0", logs()
    assert delta_rows(table) == expected  # a clean stop wrote nothing more
