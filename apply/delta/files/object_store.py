"""A table in an object store (``s3://``, ``s3a://``, ``gs://``, ``abfss://``), as pgsub's
own Delta writer reads and writes it: through obstore, the library delta-rs commits with
(the class's docstring says how each of Delta's asks is met)."""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Final, cast

from apply.delta.files.storage import Storage

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs

# What an object store's file in the making holds in memory before it spills to local disk.
_BUFFERED: Final = 16 * 2**20
# The threads that ask an object store several things at once (``ObjectStore.exist``).
_ASKING: Final = ThreadPoolExecutor(max_workers=16, thread_name_prefix="store-head")


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


def object_store(url: str, storage: Storage) -> ObjectStore:
    """The table at ``url``'s ``ObjectStore``, made once for each URL and storage."""
    key = (url.rstrip("/"), storage)
    with _OBJECT_STORES_LOCK:
        store = _OBJECT_STORES.get(key)
    if store is None:
        store = ObjectStore(*key)
        with _OBJECT_STORES_LOCK:
            store = _OBJECT_STORES.setdefault(key, store)
    return store
