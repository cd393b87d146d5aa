"""Throwaway PostgreSQL clusters: initdb, start, stop (the demo and the tests).

Each cluster lives in its own temporary folder on a free loopback port and
is never shared with anything else. PostgreSQL refuses to run as root, so
when we run as root the server runs as the unprivileged ``postgres`` OS
user (created by ``make setup``). Server binaries come from Debian's
package or from ``setup/postgres.sh`` (npm's embedded builds).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[2]  # subscriber/runtime/embedded.py
SERVER_USER = "postgres"
DEFAULT_MAJOR = 15

# Settings every throwaway cluster gets: logical decoding, room for many slots
# and sync workers, prepared transactions for two-phase tests; fsync off
# because a throwaway cluster's durability is not what is being shown.
BASE_SETTINGS: Mapping[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_wal_senders": "40",
    "max_replication_slots": "40",
    "max_worker_processes": "40",
    "max_logical_replication_workers": "20",
    "max_sync_workers_per_subscription": "4",
    "max_prepared_transactions": "20",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "wal_sender_timeout": "60s",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}


class PgSetupError(RuntimeError):
    """No PostgreSQL server binaries of the wanted major version."""


def bin_dir(major: int) -> Path:
    """Where the server binaries of ``major`` are: env, Debian, or setup/postgres.sh."""
    candidates = [
        os.environ.get(f"PGSUB_PG{major}_BIN"),
        f"/usr/lib/postgresql/{major}/bin",
        f"/opt/pgsub/postgresql/{major}/bin",  # setup/postgres.sh, as root
        str(REPO / ".pg" / str(major) / "bin"),  # setup/postgres.sh, as a user
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "postgres").exists():
            return Path(candidate)
    looked = ", ".join(c for c in candidates if c)
    raise PgSetupError(
        f"no PostgreSQL {major} server binaries (looked in {looked});"
        " run `make setup` (installs Debian's postgresql-15 and npm's embedded builds)"
    )


def available_majors() -> list[int]:
    """The majors the suite runs against: PGSUB_TEST_PG_MAJORS, else all installed."""
    wanted = os.environ.get("PGSUB_TEST_PG_MAJORS")
    if wanted:
        return [int(m) for m in wanted.split(",") if m.strip()]
    found = []
    for major in range(14, 19):
        with contextlib.suppress(PgSetupError):
            bin_dir(major)
            found.append(major)
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user() -> dict[str, object]:
    """subprocess arguments that drop root to the server's OS user."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError as exc:
        raise PgSetupError(
            f"running as root and there is no '{SERVER_USER}' OS user to run PostgreSQL as;"
            " run `make setup`"
        ) from exc
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


@dataclass
class PgCluster:
    """One running PostgreSQL server owned by the test run."""

    major: int
    settings: Mapping[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pgsub-pg-")))

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "server.log"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        binaries = bin_dir(self.major)
        env = dict(os.environ, LC_ALL="C", LANG="C")
        # The PostgreSQL binaries found by bin_dir, with arguments we build.
        return subprocess.run(  # type: ignore[call-overload, no-any-return]  # noqa: S603
            [str(binaries / args[0]), *args[1:]],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=self.root,
            **_as_server_user(),
        )

    def start(self) -> PgCluster:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SERVER_USER)
            # The server's OS user must reach its data folder under our temp dir.
            os.chmod(self.root, 0o755)  # noqa: S103
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        )
        settings = {
            **BASE_SETTINGS,
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            **self.settings,
        }
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._run(
            "pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-w", "-t", "60", "start"
        )
        return self

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-l",
            str(self.logfile),
            "-m",
            "fast",
            "-w",
            "-t",
            "60",
            "restart",
        )

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        parts = {
            "host": "127.0.0.1",
            "port": str(self.port),
            "user": "postgres",
            "dbname": dbname,
            **extra,
        }
        return " ".join(f"{key}={value}" for key, value in parts.items())

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def server_version_num(self) -> int:
        with self.connect() as conn:
            return int(conn.info.server_version)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text().splitlines()[-lines:])
        except OSError:
            return ""
