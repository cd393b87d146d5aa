"""Where one table's files live, as pgsub's own Delta writer reads and writes them.

Delta's protocol asks two things of the storage under a table's log: a
commit file appears whole and only if no other writer made that version
first (mutual exclusion, "put if absent"), and what a writer made is
there for good before it says so. pgsub confirms a batch's LSN to the
publisher once its commits are made, so both are what makes it exactly
once (docs/tables.md, "pgsub's own commits"). ``LocalStore`` gives them on
this machine's file system (``ObjectStore``, below, in an object store):

- a data or deletion vector file is written and fsynced (``write``): a
  power loss after the confirmation cannot leave it truncated;
- a commit file is written to a temporary name and fsynced, then linked
  into place (``put_if_absent``): a hard link refuses a name that exists,
  so the file appears whole and only once (as delta-rs does on a local
  folder); the log's folder and the table's are fsynced after, so the
  names are durable too - at once, or, for a batch's commits, all
  together when its writes end and before it is confirmed
  (``folders_synced_together``);
- a commit another engine made (delta-rs, Spark: neither fsyncs) is made
  durable after it (``sync``, of the files ``apply.delta.writer.live_files.
  make_durable`` reads from the commit): its commit file, the files it
  adds and the folders that hold them.

Names are relative to the table's folder, ``/``-separated, as Delta's log
spells a data file's relative path once decoded (``canonical``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Final, Protocol, cast
from urllib.parse import unquote, urlsplit

from apply.delta.files.storage import Storage

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs

LOG: Final = "_delta_log"
# What an object store's file in the making holds in memory before it spills to local disk.
_BUFFERED: Final = 16 * 2**20
# The threads that ask an object store several things at once (``ObjectStore.exist``).
_ASKING: Final = ThreadPoolExecutor(max_workers=16, thread_name_prefix="store-head")


def commit_name(version: int) -> str:
    """The log's file of ``version``, relative to the table."""
    return f"{LOG}/{version:020d}.json"


class TableStore(Protocol):
    """One table's files (``LocalStore``, ``ObjectStore``)."""

    @property
    def location(self) -> str:
        """The table's location as Delta readers open it (a folder, or a URL)."""
        ...

    @property
    def options(self) -> Mapping[str, str]:
        """What delta-rs opens the table with (``storage_options``)."""
        ...

    @property
    def filesystem(self) -> pyarrow.fs.FileSystem:
        """Where pyarrow reads the table's Parquet files (``source`` names them in it)."""
        ...

    def source(self, name: str) -> str:
        """The file ``name`` as ``filesystem`` names it."""
        ...

    def open(self, name: str, size: int | None = None) -> pa.NativeFile:
        """The file ``name``, to read (Parquet: its footer and row groups, by range);
        ``size``: its bytes, if known (a small file in an object store is then one GET)."""
        ...

    def read(self, name: str) -> bytes: ...

    def read_each(self, names: list[str]) -> list[bytes]:
        """Each of ``names``, in order (in an object store: all asked at once);
        FileNotFoundError: one is not there."""
        ...

    def read_range(self, name: str, start: int, length: int) -> bytes: ...

    def exists(self, name: str) -> bool: ...

    def exist(self, names: list[str]) -> list[bool]:
        """Whether each of ``names`` exists (in an object store: asked at once)."""
        ...

    def asking(self, names: list[str]) -> Callable[[], list[bool]]:
        """``exist(names)`` asked now and answered by the call returned: in an object store
        the requests are in flight meanwhile (a round trip the caller need not wait for);
        on a local disk answered at once."""
        ...

    def listed(self, prefix: str) -> list[str]:
        """The names of the files under the folder ``prefix`` (not its subfolders)."""
        ...

    def listed_after(self, prefix: str, after: str) -> list[str]:
        """The names under the folder ``prefix`` that sort after ``after``, in order (an
        object store lists from there: a request a thousand names, not the whole folder)."""
        ...

    def write(self, name: str, data: bytes) -> int:
        """``data`` as the file ``name``, durable when this returns; its size."""
        ...

    def writing(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A file to write ``name`` through, durable once the block exits."""
        ...

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """``data`` as the file ``name``, whole and durable, unless the name exists already
        (False, nothing written)."""
        ...

    def replace(self, name: str, data: bytes) -> None:
        """``data`` as the file ``name``, whole, over what the name held: a reader sees the
        old file or the new one, never a part (a checkpoint, ``_last_checkpoint``)."""
        ...

    def delete(self, name: str) -> None:
        """Remove the file ``name``, if it is there."""
        ...

    def delete_each(self, names: list[str]) -> None:
        """Remove each of ``names`` that is there (an object store: a request a thousand)."""
        ...

    def contents(self, prefix: str) -> tuple[list[tuple[str, float]], list[str]]:
        """The files right under the folder ``prefix`` ("": the table's), each with its
        modification time (seconds since the epoch), and its subfolders' names."""
        ...

    def oldest(self, prefix: str) -> Iterator[tuple[str, float]]:
        """The files right under the folder ``prefix`` in the order of their names, each
        with its modification time, listed as they are taken (an object store's listing a
        thousand names at a time: a caller that stops early lists no further)."""
        ...

    def sync(self, names: list[str]) -> None:
        """The files ``names``, which another engine wrote, durable with their names."""
        ...


def canonical(path: str, root: str) -> str:
    """A path as Delta's log spells it (a URI: relative to the table at ``root``, or
    absolute, percent-encoded) reduced to one spelling per file: decoded, relative to the
    table when it is inside it. ``file:/a``, ``file:///a`` and ``/a`` are one file; so are
    ``a%20b`` and ``a b``."""
    parts = urlsplit(path)
    if parts.scheme in ("", "file"):
        decoded = unquote(parts.path)
        if not decoded.startswith("/"):
            return decoded
        base = unquote(urlsplit(root).path).rstrip("/") + "/" if root else None
    else:
        decoded = f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"
        base = root.rstrip("/") + "/" if root else None
    return decoded[len(base) :] if base and decoded.startswith(base) else decoded


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
        return iter(sorted(self.contents(prefix)[0]))

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
        if not folders:
            return
        with ThreadPoolExecutor(min(_FOLDER_SYNCS, len(folders)), "folder-sync") as pool:
            for _ in pool.map(_sync_folder, folders):
                pass


# The folders a batch's own commits named new files in (``folders_synced_together``).
_PENDING: ContextVar[_Folders | None] = ContextVar("pgsub_pending_folders", default=None)
# Folders fsynced at once at a batch's end: the file system's journal takes them together.
_FOLDER_SYNCS: Final = 16


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


def _sync_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # removed since: VACUUM, a later commit
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _sync_folder(path: str) -> None:
    _sync_file(path)


class ObjectStore:
    """A table in an object store (``s3://``, ``s3a://``, ``gs://``, ``abfss://``).

    The commit files go through obstore (object store's Python binding, the
    library delta-rs commits with): ``put_if_absent`` is a conditional PUT
    (``If-None-Match: *``), which the store refuses (412) when the name exists.
    A PUT that did succeed but whose answer was lost is retried by obstore and
    then refused: the file is read back, and taken for this writer's own when
    it holds exactly what was put (each commit carries a ``txnId`` of its own).
    A successful PUT is durable: nothing is left to ``sync``. The Parquet and
    vector files are PUT whole by obstore too (``writing``: one request, a
    multipart upload only for a large file) and read through a pyarrow file
    system over the same store (ranged reads of a footer and its row groups).
    """

    def __init__(self, url: str, storage: Storage) -> None:
        from obstore.store import from_url

        self.url = url.rstrip("/")
        self._storage = storage
        config, client = storage.obstore_config()
        self._store = from_url(self.url, config=config, client_options=client)  # type: ignore[call-overload]
        self._filesystem, self._root = storage.arrow_filesystem(self.url)

    @property
    def location(self) -> str:
        return self.url

    @property
    def options(self) -> Mapping[str, str]:
        return self._storage.delta_rs_options()

    @property
    def filesystem(self) -> pyarrow.fs.FileSystem:
        return self._filesystem

    def source(self, name: str) -> str:
        return f"{self._root}/{name}"

    def open(self, name: str, size: int | None = None) -> pa.NativeFile:
        """A file of known ``size`` up to ``_BUFFERED`` bytes read whole in one GET; else
        by ranges (a HEAD for its size, then its footer, then what is read of it)."""
        if size is not None and size <= _BUFFERED:
            import pyarrow as pa

            return pa.BufferReader(self.read(name))
        return self._filesystem.open_input_file(self.source(name))

    def read(self, name: str) -> bytes:
        import obstore

        try:
            return bytes(obstore.get(self._store, name).bytes())
        except FileNotFoundError:
            raise
        except obstore.exceptions.NotFoundError as exc:
            raise FileNotFoundError(f"{self.url}/{name}") from exc

    def read_each(self, names: list[str]) -> list[bytes]:
        """One GET each, all in flight at once: a round trip, not one a name."""
        if len(names) < 2:
            return [self.read(name) for name in names]
        return list(_ASKING.map(self.read, names))

    def read_range(self, name: str, start: int, length: int) -> bytes:
        import obstore

        return bytes(obstore.get_range(self._store, name, start=start, length=length))

    def exists(self, name: str) -> bool:
        import obstore

        try:
            obstore.head(self._store, name)
        except (FileNotFoundError, obstore.exceptions.NotFoundError):
            return False
        return True

    def exist(self, names: list[str]) -> list[bool]:
        """One HEAD each, all in flight at once: a round trip, not one a name."""
        if len(names) < 2:
            return [self.exists(name) for name in names]
        return self.asking(names)()

    def asking(self, names: list[str]) -> Callable[[], list[bool]]:
        """One HEAD each, sent now; the call returned waits for their answers."""
        asked = [_ASKING.submit(self.exists, name) for name in names]
        return lambda: [answer.result() for answer in asked]

    def listed(self, prefix: str) -> list[str]:
        import obstore

        listed = obstore.list_with_delimiter(self._store, prefix.rstrip("/") + "/")
        return [str(item["path"]) for item in listed["objects"]]

    def listed_after(self, prefix: str, after: str) -> list[str]:
        import obstore

        folder = prefix.rstrip("/") + "/"
        found = obstore.list(self._store, folder, offset=after, chunk_size=1000)
        names = (str(item["path"]) for chunk in found for item in chunk)
        return sorted(name for name in names if "/" not in name.removeprefix(folder))

    def write(self, name: str, data: bytes) -> int:
        import obstore

        obstore.put(self._store, name, data)
        return len(data)

    def replace(self, name: str, data: bytes) -> None:
        self.write(name, data)  # a PUT is whole: a reader sees the old object or the new

    @contextlib.contextmanager
    def writing(self, name: str) -> Iterator[IO[bytes]]:
        """A buffer (in memory, spilled to a local temporary file past ``_BUFFERED``), PUT
        whole once the block exits: one request up to obstore's part size (5 MiB), a
        multipart upload past it - where a stream straight to the store costs three
        requests (create, part, complete) for the smallest file."""
        import obstore

        with tempfile.SpooledTemporaryFile(max_size=_BUFFERED) as buffer:
            yield cast("IO[bytes]", buffer)
            buffer.seek(0)
            obstore.put(self._store, name, buffer)

    def put_if_absent(self, name: str, data: bytes) -> bool:
        import obstore

        try:
            obstore.put(self._store, name, data, mode="create")
        except obstore.exceptions.AlreadyExistsError:
            # Someone's: another writer's, or this one's own PUT, retried after its
            # answer was lost (then it holds exactly this).
            return self.read(name) == data
        return True

    def delete(self, name: str) -> None:
        import obstore

        with contextlib.suppress(FileNotFoundError, obstore.exceptions.NotFoundError):
            obstore.delete(self._store, name)

    def delete_each(self, names: list[str]) -> None:
        import obstore

        if names:
            obstore.delete(self._store, names)  # S3: DeleteObjects, a thousand a request

    def contents(self, prefix: str) -> tuple[list[tuple[str, float]], list[str]]:
        import obstore

        lead = f"{prefix.strip('/')}/" if prefix.strip("/") else None
        listed = obstore.list_with_delimiter(self._store, lead)
        files = [(str(o["path"]), o["last_modified"].timestamp()) for o in listed["objects"]]
        return files, [str(p).rstrip("/") for p in listed["common_prefixes"]]

    def oldest(self, prefix: str) -> Iterator[tuple[str, float]]:
        import obstore

        folder = prefix.rstrip("/") + "/"
        for chunk in obstore.list(self._store, folder, chunk_size=1000):
            for item in chunk:
                name = str(item["path"])
                if "/" not in name.removeprefix(folder):
                    yield name, item["last_modified"].timestamp()

    def sync(self, names: list[str]) -> None:
        """A PUT the store answered is durable."""


# Each table's ObjectStore, by its URL and storage: made once (obstore's client - its
# HTTP connections, kept alive between requests - took 5 ms to make, a table a batch).
_OBJECT_STORES: dict[tuple[str, Storage], ObjectStore] = {}
_OBJECT_STORES_LOCK = threading.Lock()


def table_store(path: str) -> TableStore:
    """Where the table at ``path`` keeps its files: a folder here, or an object store."""
    from apply.delta.files.storage import is_object_store, storage_for

    if not is_object_store(path):
        return LocalStore(path.removeprefix("file://").removeprefix("file:"))
    key = (path.rstrip("/"), storage_for(path))
    with _OBJECT_STORES_LOCK:
        store = _OBJECT_STORES.get(key)
    if store is None:
        store = ObjectStore(*key)
        with _OBJECT_STORES_LOCK:
            store = _OBJECT_STORES.setdefault(key, store)
    return store
