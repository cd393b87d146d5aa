"""A table's log kept open between batches, and what pgsub's own commits changed.

Opening a table replays its log (15 ms for a few dozen commits); an open
delta-rs table reads only the commits after its version, but reading even
one costs about 5 ms. Most of a table's commits are pgsub's own
(``apply.delta.writer.overwrite``, ``apply.delta.writer.vector_write``), which change
nothing but the version, the live files and the batch's mark. So
``OpenTable`` keeps the version and the mark itself (and an overwrite's one
live file; a deletion vector commit's are ``LiveFiles``'s), and brings
delta-rs's snapshot forward only when something else needs it (``synced``:
a MERGE, a checkpoint) or another writer committed (``latest``: the next
version's file is there). The
protocol, schema and properties of the snapshot stay true meanwhile: an
overwrite does not change them. The one own commit that does - the batch
that turns deletion vectors on (``apply.delta.writer.protocol``) - says
what they are now (``moved_on``), and the snapshot is read again only when
something asks for it. What a batch reads of them (``fact``: the
table's Arrow schema, its properties, whether a path may write it) is kept
until the snapshot moves: asked of delta-rs at every batch, it was a few
percent of a 200-table batch's Python. The actions of pgsub's own commits
since the table's last checkpoint are kept too (``since``): its next
checkpoint is made from them (``apply.delta.writer.checkpoint``), and the
snapshot is then read from that checkpoint when next needed, not brought
forward over every commit since.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from apply.core.errors import CommitRacedError
from apply.delta.files.store import TableStore, canonical, commit_name

if TYPE_CHECKING:
    import deltalake

    from apply.delta.writer.checkpoint_actions import LogSince

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LiveFile:
    log_path: str  # as the log names it (what a ``remove`` must name)
    name: str  # the file, decoded (``apply.delta.files.store.canonical``)
    size: int
    rows: int | None = None  # its statistics' row count, if it has one


@dataclass(frozen=True, slots=True)
class _Own:
    """The table after pgsub's last own commit, while the snapshot has not read it: an
    overwrite's one live file, or None (a deletion vector commit's files are
    ``apply.delta.writer.live_files``'s to know)."""

    version: int
    file: LiveFile | None


class OpenTable:
    """One table's delta-rs snapshot plus the state of pgsub's commits after it."""

    def __init__(self, store: TableStore, table: deltalake.DeltaTable) -> None:
        self.store = store
        self._table = table  # protocol, schema, properties: current; files: see ``files``
        self._stale = False  # pgsub's own commit changed its protocol or properties: ``table``
        self._own: _Own | None = None
        self._marks: dict[str, int] = {}  # app id -> its batch version, as of _marks_at
        self._marks_at = -1
        self._asked: Callable[[], list[bool]] | None = None  # ``ask_latest``'s answer
        self._facts: dict[Hashable, Any] = {}  # ``fact``'s, of the snapshot as it is
        # The log since its last checkpoint, as pgsub's own commits made it
        # (``apply.delta.writer.checkpoint``); None: not known here.
        self.since: LogSince | None = None
        self._read_anew = False  # ``synced`` reads the snapshot from the latest checkpoint

    @property
    def table(self) -> deltalake.DeltaTable:
        """delta-rs's snapshot: its protocol, schema and properties are the table's (read
        again first if pgsub's own commit changed them: ``moved_on``); its files, see
        ``files``."""
        if self._stale:
            return self.synced()
        return self._table

    @property
    def version(self) -> int:
        return self._own.version if self._own is not None else self.table.version()

    def fact(self, key: Hashable, read: Callable[[deltalake.DeltaTable], T]) -> T:
        """``read(self.table)``, kept under ``key`` until the snapshot moves (``synced``, or
        a commit by delta-rs: ``wrote``): for what ``read`` takes from the snapshot's
        protocol, schema or properties alone, which pgsub's own commits do not change."""
        if key not in self._facts:
            self._facts[key] = read(self.table)
        value: T = self._facts[key]
        return value

    @property
    def arrow_schema(self) -> pa.Schema:
        """The table's schema in Arrow's types."""
        return self.fact("arrow_schema", lambda table: pa.schema(table.schema().to_arrow()))

    @property
    def configuration(self) -> dict[str, str]:
        """The table's properties."""
        return self.fact("configuration", lambda table: dict(table.metadata().configuration))

    def latest(self) -> bool:
        """Brought up to the table's latest commit; False: the log is not the one read (its
        version is gone: the table was made anew). The next commit file not there says no
        one else wrote. Both asked at once: in an object store, two HEADs in one round
        trip."""
        here, after = self.store.exist(self._checked())
        if not here:
            return False
        if after:
            self.synced()
        return True

    def ask_latest(self) -> None:
        """``latest``'s question sent without waiting for its answer: in an object store its
        round trip runs while a batch writes its files, and ``confirm_latest`` takes the
        answer before the commit that needs it."""
        self._asked = self.store.asking(self._checked())

    def _checked(self) -> list[str]:
        """What ``latest`` asks: the version this table read still there, the next one free."""
        return [commit_name(self.version), commit_name(self.version + 1)]

    def confirm_latest(self) -> None:
        """The answer to ``ask_latest``, if one is awaited: the log as this table last read
        it, or a ``CommitRacedError`` (nothing committed; the table read anew at the next
        attempt) - another writer committed since, or the table is gone or made anew."""
        asked, self._asked = self._asked, None
        if asked is None:
            return
        here, after = asked()
        if after or not here:
            raise CommitRacedError(
                f"the log of {self.store.location} moved on from version {self.version}: "
                + ("another writer committed since" if here else "the table is gone or made anew")
            )

    def synced(self) -> deltalake.DeltaTable:
        """delta-rs's snapshot, brought up to the log's latest commit."""
        if self._read_anew:
            return self.reopened()
        self._table.update_incremental()
        self._own = None
        self._stale = False
        self._facts.clear()
        return self._table

    def moved_on(self, facts: dict[Hashable, Any]) -> None:
        """pgsub's own last commit changed the table's protocol or properties (deletion
        vectors turned on in a batch's commit: ``apply.delta.writer.protocol``): the snapshot
        is read again when something next asks for it (``table``), and until then ``fact``
        answers ``facts`` - what the committer knows of the table as it is now - without
        that read (in an object store, a listing and a GET a table)."""
        self._stale = True
        self._facts = dict(facts)

    def checkpointed(self) -> None:
        """pgsub wrote the table's checkpoint at its latest commit: delta-rs's snapshot,
        when something next needs it, is read from there (``reopened``), not brought
        forward over every commit since its version, each read twice. Until then it stays
        as it is - its protocol, schema and properties are the table's - and asks nothing
        of the store."""
        self._read_anew = True

    def reopened(self) -> deltalake.DeltaTable:
        """delta-rs's snapshot read anew from the table's latest checkpoint and the
        commits after it."""
        import deltalake

        options = dict(self.store.options) or None
        self._table = deltalake.DeltaTable(self.store.location, storage_options=options)
        self._read_anew = False
        self._own = None
        self._stale = False
        self._facts.clear()
        return self._table

    def current(self) -> deltalake.DeltaTable:
        """delta-rs's snapshot as of the latest commit ``latest`` saw: as it is, unless
        pgsub's own commit came since (then ``synced``). Each batch's write asks ``latest``
        first (``apply.delta.writer.local_merge.LocalMerges``), so this saves a listing of
        the log."""
        return self.synced() if self._own is not None else self.table

    def files(self) -> list[LiveFile]:
        """The table's live files."""
        if self._own is not None and self._own.file is not None:
            return [self._own.file]
        if self._own is not None:
            self.synced()
        actions = pa.table(self.table.get_add_actions(flatten=True))
        if not actions.num_rows:
            return []
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        counts = (
            actions.column("num_records").to_pylist()
            if "num_records" in actions.column_names
            else [None] * len(paths)
        )
        location = self.store.location
        return [
            LiveFile(path, canonical(path, location), int(size), rows)
            for path, size, rows in zip(paths, sizes, counts, strict=True)
        ]

    def done(self, app_id: str) -> int | None:
        """The last batch version of ``app_id`` the table has (Delta's txn), or None."""
        if self._marks_at == self.version and app_id in self._marks:
            return self._marks[app_id]
        return self.current().transaction_version(app_id)

    def wrote(
        self,
        app_id: str,
        batch_version: int,
        own: LiveFile | None = None,
        *,
        by_own: bool = False,
        actions: list[dict[str, Any]] | None = None,
    ) -> None:
        """This process just committed ``app_id``'s batch ``batch_version``: by delta-rs
        (the snapshot moved), by its own overwrite whose one file is ``own``, or by its own
        deletion vector commit (``by_own``); ``actions``: the commit's, if pgsub wrote
        them (kept for the table's next checkpoint)."""
        before = self.version
        if actions is not None and self.since is not None and self.since.version == before:
            self.since.take(before + 1, actions)
        else:
            self.since = None  # the next checkpoint reads the log since the last one
        if own is not None or by_own:
            self._own = _Own(before + 1, own)
        else:  # delta-rs's commit moved the snapshot
            self._facts.clear()
        if self._marks_at != self.version - 1:
            self._marks.clear()  # known only as of the commit before ours
        self._marks[app_id] = batch_version
        self._marks_at = self.version
