"""The Spark JVM's scratch folder: one per process, held while it lives, reclaimed after.

A local Spark JVM keeps its scratch under its temp dir and Spark's local dir:
the session's Python files and a cluster's jars (``spark-*``), the
shuffle's blocks (``blockmgr-*``), the native libraries it unpacks
(``liblz4-java-*.so``, ``snappy-*.so``), S3A's upload buffers. It removes
them as it exits; one that is killed (an OOM kill, a failed liveness probe,
kill -9) cannot, and a volume that outlives the container (the chart's
spool: an ``emptyDir`` across the container's restarts, or a persistent
volume) filled up one crash at a time.

So each process's JVM keeps its scratch in a folder of its own,
``<TMPDIR>/pgsub-<uid>/scratch/<pid>-<random>``, which the process holds
locked (``flock`` on the folder's ``.held``) as long as it lives: the kernel
drops a process's locks however it ends. Before a process makes its folder
it removes every folder no process holds. Both take the root's own lock
(``scratch/.lock``), so no process sees a folder between its making and its
lock.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from apply.core.folders import private_directory
from subscriber.replication.errors import UsageError

log = structlog.get_logger(__name__)

_HELD = ".held"


class ScratchError(UsageError):
    """The scratch folder cannot be made or is not this user's alone (exit 2, as a bad
    config: ``TMPDIR`` is the user's to fix)."""


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """What one claim removed of the processes that had stopped."""

    folders: int = 0
    bytes: int = 0


@functools.cache
def process_scratch() -> Path:
    """This process's scratch folder, under ``TMPDIR``: made at the first call (the stopped
    processes' removed then), removed as the process exits."""
    folder, reclaimed = claim(Path(tempfile.gettempdir()) / f"pgsub-{os.getuid()}" / "scratch")
    if reclaimed.folders:
        log.info(
            "scratch of stopped processes removed",
            folder=str(folder.parent),
            folders=reclaimed.folders,
            megabytes=round(reclaimed.bytes / 2**20, 1),
        )
    return folder


def claim(root: Path) -> tuple[Path, Reclaimed]:
    """A new folder under ``root``, held by this process until it exits (then removed),
    after every folder there that no process holds is removed."""
    for directory in (root.parent, root):
        # not a folder someone else made first under a shared /tmp
        private_directory(
            directory,
            what="Spark's scratch folder",
            remedy="set TMPDIR to a directory of this user's",
            error=ScratchError,
        )
    try:
        with _root_lock(root):
            reclaimed = _reclaim(root)
            folder = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
            held = _lock(folder / _HELD, wait=True)
    except OSError as exc:  # a file system without locks (some network or FUSE ones)
        raise ScratchError(
            f"cannot make or lock Spark's scratch folder under {root}: {exc}; set TMPDIR to "
            "a directory of a local file system"
        ) from exc
    assert held is not None  # a blocking lock returns one
    atexit.register(_release, folder, held)
    return folder, reclaimed


@contextlib.contextmanager
def _root_lock(root: Path) -> Iterator[None]:
    held = _lock(root / ".lock", wait=True)
    assert held is not None
    try:
        yield
    finally:
        os.close(held)  # closing the last descriptor of a lock releases it


def _lock(path: Path, *, wait: bool) -> int | None:
    """A descriptor of ``path`` holding its exclusive lock, or None when another process
    holds it (and ``wait`` is False)."""
    held = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by children
    try:
        fcntl.flock(held, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(held)
        return None
    except BaseException:
        os.close(held)
        raise
    return held


def _reclaim(root: Path) -> Reclaimed:
    """Remove the folders under ``root`` that no living process holds."""
    folders = size = 0
    for entry in root.iterdir():
        if entry.is_symlink() or not entry.is_dir():
            continue
        try:
            held = _lock(entry / _HELD, wait=False)
        except OSError:  # removed meanwhile, or not ours to open
            continue
        if held is None:
            continue  # its process lives
        try:
            size += _size(entry)
            shutil.rmtree(entry, ignore_errors=True)
            folders += 1
        finally:
            os.close(held)
    return Reclaimed(folders, size)


def _size(folder: Path) -> int:
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _release(folder: Path, held: int) -> None:
    """At exit: the folder removed (what a JVM still writing leaves, the next claim
    removes), then its lock dropped."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(held)
