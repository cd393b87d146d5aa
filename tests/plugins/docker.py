"""A container engine and the project's image, for the tests of deploy/.

The engine is Debian's docker.io (``make tools`` installs it as root); its
client has BuildKit built in, which the Dockerfile's optional CA secret
needs. There is no registry here, so the base image is Debian bookworm made
with debootstrap and ``docker import``. ``image`` builds deploy/Dockerfile on
it, as a user would (tests/deploy/test_image_build.py runs it under docker,
tests/deploy/test_kubernetes.py on a cluster).

One engine for the whole run: the first test process that needs it starts
``dockerd`` (under a lock, so two processes never start two), and the run's
main process stops it at the end (``pytest_unconfigure``), after every
worker is done - nothing is left running, even after a failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.pgcluster import wait_until

ROOT = Path(__file__).resolve().parents[2]
BASE = "pgsub-base:bookworm"
IMAGE = "pgsub:test"
# The CA bundle of this machine: behind a TLS-intercepting proxy the build needs it.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Set by the run's main process before any worker starts; the workers inherit it.
RUN_FOLDER = "PGSUB_TEST_RUN_FOLDER"


def _run(*args: str, timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


class Docker:
    """The docker client, with BuildKit on."""

    def __init__(self, client: str) -> None:
        self.client = client

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        return _run(self.client, *args, timeout=timeout, env=env)

    def ok(self, *args: str, timeout: float = 600) -> str:
        done = self(*args, timeout=timeout)
        assert done.returncode == 0, f"docker {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def _docker_client() -> str | None:
    # Debian's client (BuildKit built in) before a newer one that needs the buildx plugin.
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _run_folder() -> Path:
    return Path(os.environ.get(RUN_FOLDER) or tempfile.gettempdir())


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    with (_run_folder() / name).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and RUN_FOLDER not in os.environ:
        os.environ[RUN_FOLDER] = tempfile.mkdtemp(prefix="pgsub-test-run-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The main process, last of all: stop the dockerd a test process started."""
    if hasattr(config, "workerinput"):
        return
    folder = os.environ.get(RUN_FOLDER)
    if folder is None:
        return
    pidfile = Path(folder) / "dockerd.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):  # not this process's child
                    os.waitpid(pid, os.WNOHANG)  # this process's (no xdist): reaped, not a zombie
                os.killpg(pid, 0)  # raises once the group is gone
                time.sleep(0.5)
            os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def docker() -> Docker:
    """A running engine: the machine's, or the dockerd of this run."""
    client = _docker_client()
    if client is None or shutil.which("dockerd") is None:
        pytest.skip("no container engine here (make tools installs Debian's docker.io as root)")
    engine = Docker(client)
    with _locked("dockerd.lock"):
        if engine("info", timeout=30).returncode != 0:
            if os.geteuid() != 0:
                pytest.skip("dockerd is installed but not running, and only root can start it")
            log = _run_folder() / "dockerd.log"
            with log.open("wb") as out:
                started = subprocess.Popen(
                    ["dockerd"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            (_run_folder() / "dockerd.pid").write_text(str(started.pid))
            wait_until(
                lambda: engine("info", timeout=30).returncode == 0,
                timeout=60,
                what=f"dockerd to start (its log: {log})",
            )
    return engine


@pytest.fixture(scope="session")
def image(docker: Docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """deploy/Dockerfile built on a debootstrapped Debian bookworm."""
    with _locked("image.lock"):
        if docker("image", "inspect", BASE, timeout=30).returncode != 0:
            _make_base(docker, tmp_path_factory.mktemp("rootfs"))
        secret = ["--secret", f"id=ca,src={CA_BUNDLE}"] if CA_BUNDLE.exists() else []
        docker.ok(
            "build", "--progress=plain", *secret, "--build-arg", f"BASE={BASE}",
            "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", IMAGE, str(ROOT), timeout=1800,
        )  # fmt: skip
    return IMAGE


def _make_base(docker: Docker, rootfs: Path) -> None:
    if shutil.which("debootstrap") is None:
        pytest.skip("no debootstrap to make the base image (make tools installs it)")
    done = _run(
        "debootstrap", "--variant=minbase", "bookworm", str(rootfs),
        "http://deb.debian.org/debian", timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(
        [docker.client, "import", "-", BASE], stdin=tar.stdout, capture_output=True,
        check=False, timeout=600,
    )  # fmt: skip
    tar.wait()
    assert imported.returncode == 0, imported.stderr
    shutil.rmtree(rootfs, ignore_errors=True)
