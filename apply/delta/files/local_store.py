"""A table in a folder of this machine, held to what Delta's protocol asks of its storage.

Delta's protocol asks two things of the storage under a table's log: a
commit file appears whole and only if no other writer made that version
first (mutual exclusion, "put if absent"), and what a writer made is
there for good before it says so. pgsub confirms a batch's LSN to the
publisher once its commits are made, so both are what makes it exactly
once (docs/tables.md, "pgsub's own commits"). ``LocalStore`` gives them on
this machine's file system (``apply.delta.files.object_store`` in an
object store):

- a data or deletion vector file is written and fsynced (``write``): a
  power loss after the confirmation cannot leave it truncated;
- a commit file is written to a temporary name and fsynced, then linked
  into place (``put_if_absent``): a hard link refuses a name that exists,
  so the file appears whole and only once (as delta-rs does on a local
  folder); the log's folder and the table's are fsynced after, so the
  names are durable too - at once, or, for a batch's commits (and an
  initial load's creation and copy of a table), all together when its
  writes end and before it is confirmed (``folders_synced_together``);
- a checkpoint or ``_last_checkpoint`` is written to a temporary name and
  renamed over the old (``replace``): a reader sees one file or the other;
- a commit another engine made (delta-rs, Spark: neither fsyncs) is made
  durable after it (``sync``, of the files ``apply.delta.writer.live_files.
  make_durable`` reads from the commit): its commit file, the files it
  adds and the folders that hold them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Final

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs


@dataclass(frozen=True, slots=True)
class LocalStore:
    """A table in a folder of this machine."""

    folder: str

    @property
    def location(self) -> str:
        return self.folder

    @property
    def options(self) -> Mapping[str, str]:
        return {}

    @property
    def filesystem(self) -> pyarrow.fs.FileSystem:
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem()

    def open(self, name: str, size: int | None = None) -> pa.NativeFile:
        import pyarrow as pa

        return pa.OSFile(self.source(name))

    def _file(self, name: str) -> str:
        """``name``'s path, as a string: a batch asks for a dozen a table, and a ``Path``
        each was a few percent of a 200-table batch's Python."""
        return name if name.startswith("/") else os.path.join(self.folder, name)

    def read(self, name: str) -> bytes:
        with open(self._file(name), "rb") as file:
            return file.read()

    def read_each(self, names: list[str]) -> list[bytes]:
        return [self.read(name) for name in names]

    def read_range(self, name: str, start: int, length: int) -> bytes:
        with open(self._file(name), "rb") as file:
            file.seek(start)
            return file.read(length)

    def exists(self, name: str) -> bool:
        return os.path.exists(self._file(name))

    def exist(self, names: list[str]) -> list[bool]:
        return [self.exists(name) for name in names]

    def asking(self, names: list[str]) -> Callable[[], list[bool]]:
        found = self.exist(names)
        return lambda: found

    def source(self, name: str) -> str:
        return self._file(name)

    def listed(self, prefix: str) -> list[str]:
        folder = self._file(prefix)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        listed = (n for n in names if os.path.isfile(os.path.join(folder, n)))
        return [f"{prefix.rstrip('/')}/{n}" for n in listed]

    def listed_after(self, prefix: str, after: str) -> list[str]:
        return sorted(name for name in self.listed(prefix) if name > after)

    def write(self, name: str, data: bytes) -> int:
        with self.writing(name) as file:
            file.write(data)
        return len(data)

    @contextlib.contextmanager
    def writing(self, name: str) -> Iterator[IO[bytes]]:
        with open(self._file(name), "xb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())

    @contextlib.contextmanager
    def _beside(self, name: str, data: bytes) -> Iterator[tuple[str, str]]:
        """``data`` written and fsynced to a temporary name beside ``name``'s file: that
        name and the file's path, the temporary removed when the block ends."""
        final = self._file(name)
        parent, base = os.path.split(final)
        temporary = os.path.join(parent, f".{base}.{uuid.uuid4()}.tmp")
        self.write(temporary, data)
        try:
            yield temporary, final
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)

    def replace(self, name: str, data: bytes) -> None:
        with self._beside(name, data) as (temporary, final):
            os.replace(temporary, final)
        # The name is durable before the call returns, not at the batch's end: a checkpoint's
        # name must survive a power loss that ``_last_checkpoint``, replaced next, survives.
        _sync_folder(os.path.dirname(final))

    def put_if_absent(self, name: str, data: bytes) -> bool:
        with self._beside(name, data) as (temporary, final):
            try:
                os.link(temporary, final)
            except FileExistsError:
                return False
        parent = os.path.dirname(final)
        folders = (parent, os.path.normpath(self.folder))
        pending = _PENDING.get()
        if pending is None:
            for path in folders:
                _sync_folder(path)
        else:
            pending.add(folders)
        return True

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file(name))

    def delete_each(self, names: list[str]) -> None:
        for name in names:
            self.delete(name)

    def contents(self, prefix: str) -> tuple[list[tuple[str, float]], list[str]]:
        files: list[tuple[str, float]] = []
        folders: list[str] = []
        lead = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        with contextlib.suppress(FileNotFoundError), os.scandir(self._file(lead or ".")) as found:
            for entry in found:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(lead + entry.name)
                elif entry.is_file(follow_symlinks=False):
                    files.append((lead + entry.name, entry.stat().st_mtime))
        return files, folders

    def oldest(self, prefix: str) -> Iterator[tuple[str, float]]:
        """Each file's modification time read as it is taken: a caller that stops at the
        first young file of a week's log stats a few files, not 600,000."""
        lead = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        try:
            with os.scandir(self._file(lead or ".")) as found:
                files = sorted(
                    (entry for entry in found if entry.is_file(follow_symlinks=False)),
                    key=lambda entry: entry.name,
                )
        except FileNotFoundError:
            return
        for entry in files:
            try:
                modified = entry.stat().st_mtime
            except FileNotFoundError:
                continue  # removed since it was listed
            yield lead + entry.name, modified

    def sync(self, names: list[str]) -> None:
        files = [self._file(name) for name in names]
        for file in files:
            _sync_file(file)
        for folder in {os.path.dirname(file) for file in files} | {os.path.normpath(self.folder)}:
            _sync_folder(folder)


class _Folders:
    """Folders whose new names a batch's commits made, to be made durable at its end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folders: set[str] = set()

    def add(self, folders: tuple[str, ...]) -> None:
        with self._lock:
            self._folders.update(folders)

    def sync(self) -> None:
        with self._lock:
            folders, self._folders = sorted(self._folders), set()
        if folders:
            for _ in _SYNCING.map(_sync_folder, folders):
                pass


# The folders a batch's own commits named new files in (``folders_synced_together``).
_PENDING: ContextVar[_Folders | None] = ContextVar("pgsub_pending_folders", default=None)
# Folders fsynced at once at a batch's end: the file system's journal takes them together.
_FOLDER_SYNCS: Final = 16
# The threads that fsync them, started once: a batch's ended writes are made durable every
# 50 ms while it is written (``apply.worker.writes_ahead.Settling``), and a pool made for
# each call started its threads again each time - over 200 tables, 40% of the apply thread's
# samples in ``Thread.start``, each waiting for Python's lock (docs/performance.md,
# "Folder syncs on threads started once").
_SYNCING: Final = ThreadPoolExecutor(_FOLDER_SYNCS, thread_name_prefix="folder-sync")


@contextlib.contextmanager
def folders_synced_together() -> Iterator[None]:
    """The names pgsub's own commits make inside this block (and in the threads it starts
    with a copy of its context) made durable together when it ends, not each at its commit.

    A commit's files and its commit file are still fsynced before the commit file is linked
    into place: a commit file whose name survives a power loss always holds every byte, and
    so do the files it names. What waits is only the fsync of the folders naming them (a
    log's and a table's), which a batch needs before its LSN is confirmed, not before its
    next table (200 tables: 400 folders a batch, now fsynced side by side at its end; the
    gain measured within the spread of runs, docs/performance.md). Ends with the folders
    synced also when the block raises: a batch applied again may build on them."""
    if _PENDING.get() is not None:  # within one already: its end syncs these too
        yield
        return
    pending = _Folders()
    token = _PENDING.set(pending)
    try:
        yield
    finally:
        _PENDING.reset(token)
        pending.sync()


def sync_named_folders() -> None:
    """Within ``folders_synced_together``: the folders named so far fsynced now, not at the
    block's end (what a batch confirms before its last table is written)."""
    pending = _PENDING.get()
    if pending is not None:
        pending.sync()


def _sync_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # removed since: VACUUM, a later commit
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _sync_folder(path: str) -> None:
    _sync_file(path)
