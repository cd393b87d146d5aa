"""Where one table's files live, as pgsub's own Delta writer reads and writes them.

``TableStore`` is what the writer asks of a table's storage: put-if-absent
for a commit, durable files, whole replacements, listings. Delta's protocol
asks that of any storage under a table's log; ``LocalStore`` gives it on
this machine's file system (``apply.delta.files.local_store``),
``ObjectStore`` in an object store (``apply.delta.files.object_store``);
``table_store`` picks one for a table's path.

Names are relative to the table's folder, ``/``-separated, as Delta's log
spells a data file's relative path once decoded (``canonical``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Final, Protocol
from urllib.parse import unquote, urlsplit

from apply.delta.files.local_store import LocalStore
from apply.delta.files.object_store import object_store

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs

LOG: Final = "_delta_log"


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
        old file or the new one, never a part (a checkpoint, ``_last_checkpoint``). Durable
        when it returns, its name too: what is replaced next may name it."""
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


# How much Parquet an Arrow stream over a Python file holds before it hands it over.
STREAM_BUFFER: Final = 4 << 20


@contextlib.contextmanager
def arrow_stream(file: IO[bytes]) -> Iterator[pa.NativeFile]:
    """``file`` (a store's ``writing``) as an Arrow stream that hands it the bytes written
    ``STREAM_BUFFER`` at a time, and the rest as the block exits; ``file`` stays open (its
    fsync or PUT, and its close, are the store's).

    Parquet's writer, given a Python file, calls back into Python for every page and
    footer it writes, each call waiting for Python's lock; behind a thread that runs
    Python (the receiver under a backlog, the other writers), each wait lasts up to the
    interpreter's switch interval. A 1M-row file took 2.2 s beside such a thread, 0.14 s
    through this stream (docs/performance.md, "Parquet written without Python's lock")."""
    import pyarrow as pa

    stream = pa.BufferedOutputStream(pa.PythonFile(file, mode="w"), STREAM_BUFFER)
    try:
        yield stream
    finally:
        stream.detach()  # what it holds written to ``file``, which it leaves open


def parquet_file(store: TableStore, rows: pa.Table) -> tuple[str, int]:
    """``rows`` as one new Parquet file of the table in ``store``, durable as the store
    makes it: its name and size."""
    import uuid

    import pyarrow.parquet as pq

    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    with store.writing(name) as file:
        with arrow_stream(file) as stream:
            pq.write_table(rows, stream, compression="snappy")
        return name, file.tell()


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


def table_store(path: str) -> TableStore:
    """Where the table at ``path`` keeps its files: a folder here, or an object store."""
    from apply.delta.files.storage import is_object_store, storage_for

    if not is_object_store(path):
        return LocalStore(path.removeprefix("file://").removeprefix("file:"))
    return object_store(path, storage_for(path))
