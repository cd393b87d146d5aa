"""Every commit pgsub makes on a local warehouse, durable before it builds on it or confirms it.

A batch's LSN is confirmed to the publisher once its commits are made
(docs/architecture.md, "Durability"): from then on the slot no longer keeps
the WAL, so the commits must survive a power loss, not only a crash of the
process. pgsub's own commits are fsynced as they are made
(``apply.delta.files.store``); delta-rs and Spark fsync nothing on a local folder.
So after each write, whatever its engine, ``Durability.settle`` fsyncs the
table's commits made since the last one it settled - maintenance's and a
schema change's included, which a later commit builds on: a lost commit
under a durable later one would leave a gap no reader gets past - with the
files each adds (``apply.delta.writer.live_files.make_durable``).

On object storage a commit is durable when its PUT returns, and nothing is
left to do.
"""

from __future__ import annotations

import threading

from apply.delta.files.local_store import LocalStore
from apply.delta.files.store import commit_name
from apply.delta.writer.live_files import make_durable
from apply.delta.writer.local_tables import folder


class Durability:
    """Which version of each table on a local warehouse is known durable."""

    def __init__(self, local: bool) -> None:
        self.local = local
        self._settled: dict[str, int] = {}  # table path -> the version durable through
        self._lock = threading.Lock()

    def known(self, path: str, version: int | None) -> None:
        """The table at ``path`` is at ``version`` (None: there is none) before this process
        commits to it: its commits so far were made by earlier runs, which settled what they
        confirmed."""
        if not self.local or version is None:
            return
        with self._lock:
            self._settled.setdefault(path, version)

    def settle(self, path: str, version: int | None, *, made_durable: bool = False) -> None:
        """The commits of the table at ``path`` through ``version`` durable; ``version``
        itself already is with ``made_durable`` (pgsub's own commit)."""
        if not self.local or version is None:
            return
        with self._lock:
            since = self._settled.get(path, version - 1)
        if since >= version:
            return
        store = LocalStore(folder(path))
        for at in range(since + 1, version if made_durable else version + 1):
            if store.exists(commit_name(at)):  # else cleaned up long since: a checkpoint holds it
                make_durable(store, at)
        with self._lock:
            self._settled[path] = max(version, self._settled.get(path, version))

    def forget(self, path: str) -> None:
        """The table was made anew: its versions start again."""
        with self._lock:
            self._settled.pop(path, None)
