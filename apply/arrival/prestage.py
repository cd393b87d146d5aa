"""A large transaction staged while it arrives, so that at its commit only the MERGE is left.

A transaction that goes to a spool (``apply.arrival.spool``: every streamed one, and
one that outgrew a batch) used to be read back at its commit, netted a piece
at a time and staged as Parquet (``apply.plans.staging``) before its one MERGE per
table: 0.8 s of a 1M-row UPDATE's 7.1 s, 4.7 s of a 5M-row INSERT's 20 s,
on the apply thread, while nothing else was applied.

Here the spool hands each frame it writes to the transaction's ``Prestage``
as well, on the receiver's thread. Frames are cut into pieces within the
batch bounds, as ``SpooledTransaction.frames`` cuts them at the commit, and
each piece is netted and staged on the pipeline's prestaging thread while
the next ones arrive. What is done here needs nothing of the apply side: a
piece's tables in columns (``apply.columns.change_columns``), their target schema
from the Relation, their net effect in Arrow (``apply.batching.columns_net``).

What only the commit can say - whether the leader applies the table at the
transaction's final LSN, whether a crash left the table part way through it,
the table's schema and layout as the applier sees them - is checked by the
applier then (``BatchApplier.apply_whole``). A transaction the prestage
cannot take is abandoned, with its reason, and staged at its commit as
before:

- changes that did not come as columns (TOAST, messages, TRUNCATE, rows held
  in memory before the spool), or a table with no key;
- a subtransaction rolled back (its frames are cut from the spool);
- a table whose columns changed within the transaction, or a source the
  one-MERGE path refuses (``StagedSource.add_source``);
- the prestaging thread ``BEHIND`` by more than ``WAIT`` seconds: the
  receiver never waits longer for it.

Memory is one piece being filled and at most ``BEHIND`` pieces waiting,
each within the batch bounds.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from apply.arrival.spooled_piece import SpooledPiece
from apply.batching.collapse import is_keyed
from apply.batching.columns_net import keyed_columns_source
from apply.columns.change_columns import ChangeColumns
from apply.columns.schema import TargetSchema, target_schema
from apply.columns.typemap import TypeLookup
from apply.core.transactions import Bounds, RemoteTransaction
from apply.plans.staging import StagedSource
from subscriber.replication.lsn import ZERO
from subscriber.replication.messages import Relation

log = structlog.get_logger(__name__)

BEHIND: Final = 2  # pieces waiting for the prestaging thread before the receiver waits
WAIT: Final = 10.0  # seconds the receiver waits for it before the prestage is abandoned


@dataclass
class Prestaged:
    """A transaction's stages, made while it arrived: what ``apply_whole`` checks and MERGEs."""

    root: Path
    stages: dict[str, StagedSource] = field(default_factory=dict)
    relations: dict[str, Relation] = field(default_factory=dict)  # each table's last
    operations: Counter[str] = field(default_factory=Counter)
    changes: int = 0


class Prestage:
    """One spooled transaction's staging while it arrives (see the module)."""

    def __init__(
        self, xid: int, root: Path, prestager: Prestager, *, binary_needs_text: bool
    ) -> None:
        self.xid = xid
        self._prestager = prestager
        self._binary_needs_text = binary_needs_text  # binary: true with text forms to fetch
        self._head = RemoteTransaction(xid, ZERO, ZERO, 0, ())
        self._frames: list[ChangeColumns] = []
        self._count = self._size = 0
        self._first = 0
        self._waiting = threading.BoundedSemaphore(BEHIND)
        self._futures: list[Future[None]] = []
        self._lock = threading.Lock()
        self.abandoned: str | None = None  # why, once abandoned
        self.prestaged = Prestaged(root)

    # -- the receiver's side -------------------------------------------------

    def columns(self, changes: ChangeColumns) -> None:
        """One frame of columns, as the spool wrote it."""
        if self.abandoned is not None:
            return
        self._frames.append(changes)
        self._count += changes.rows
        self._size += changes.size
        if self._prestager.bounds.reached(self._count, self._size):
            self._submit()

    def rows(self) -> None:
        """Changes that did not come as columns were spooled."""
        self.abandon("changes that did not come as columns (TOAST, messages, TRUNCATE)")

    def abandon(self, why: str) -> None:
        with self._lock:
            if self.abandoned is None:
                self.abandoned = why
        self._frames = []

    def finish(self) -> None:
        """The transaction's last frame is spooled: its last piece goes to be staged."""
        if self._frames:
            self._submit()

    def _submit(self) -> None:
        frames, self._frames = tuple(self._frames), []
        piece = SpooledPiece(self._head, frames, self._first, self._count)
        self._first += self._count
        self._count = self._size = 0
        if not self._waiting.acquire(timeout=WAIT):
            self.abandon(f"the prestaging thread was more than {WAIT:.0f} s behind")
            return
        try:
            future = self._prestager.pool.submit(self._stage, piece)
        except RuntimeError:  # the pipeline is stopping
            self._waiting.release()
            self.abandon("the pipeline stopped")
            return
        self._futures.append(future)

    # -- the prestaging thread -------------------------------------------------

    def _stage(self, piece: SpooledPiece) -> None:
        try:
            if self.abandoned is None:
                self._stage_piece(piece)
        except Exception as exc:  # noqa: BLE001 - staged at the commit instead, as before
            self.abandon(f"{type(exc).__name__}: {exc}")
        finally:
            self._waiting.release()

    def _stage_piece(self, piece: SpooledPiece) -> None:
        columns, rows = piece.split()
        if rows.changes:
            self.abandon("a table's changes in rows and columns in one piece")
            return
        prestaged = self.prestaged
        for name, changes in columns.items():
            relation = changes.relation
            if not is_keyed(relation):
                self.abandon(f"table {name} has no key")
                return
            if self._binary_needs_text and changes.has_binary:
                self.abandon(f"table {name} has binary values to read in text")
                return
            schema = self._schema(relation)
            source = keyed_columns_source(changes, schema)
            stage = prestaged.stages.get(name)
            if stage is None:
                directory = prestaged.root / f"{len(prestaged.stages):04d}"
                stage = prestaged.stages[name] = StagedSource(directory, schema)
            if source is None or stage.schema != schema or not stage.add_source(source):
                self.abandon(f"table {name}: a source the one-MERGE path does not take")
                return
            prestaged.relations[name] = relation
        prestaged.operations.update(piece.operations())
        prestaged.changes += piece.count

    def _schema(self, relation: Relation) -> TargetSchema:
        return target_schema(relation, self._prestager.types, is_keyed(relation))

    # -- the apply side, at the commit -----------------------------------------

    def result(self) -> Prestaged | None:
        """The stages once every piece is staged; None when abandoned (and removed)."""
        for future in self._futures:
            future.result()
        if self.abandoned is not None:
            log.info(
                "transaction staged at its commit",
                subscription=self._prestager.subscription,
                xid=self.xid,
                why=self.abandoned,
            )
            self.discard()
            return None
        return self.prestaged

    def discard(self) -> None:
        """Forget the stages (applied, abandoned, or the transaction aborted): once the piece
        being staged, if any, is done, so that nothing is written after its removal."""
        self.abandon("discarded")
        for future in self._futures:
            if not future.cancel():
                future.result()  # ``_stage`` raises nothing
        shutil.rmtree(self.prestaged.root, ignore_errors=True)


class Prestager:
    """A pipeline's prestaging thread, and where its transactions are staged."""

    def __init__(
        self,
        subscription: str,
        root: Path,
        types: TypeLookup,
        bounds: Bounds,
        *,
        binary_needs_text: bool,
    ) -> None:
        self.subscription = subscription
        self.root = root
        self.types = types
        self.bounds = bounds
        self._binary_needs_text = binary_needs_text
        self._made = 0
        shutil.rmtree(root, ignore_errors=True)  # what an earlier pipeline left
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prestage")

    def open(self, xid: int) -> Prestage:
        self._made += 1
        return Prestage(
            xid,
            self.root / f"tx-{xid}-{self._made}",
            self,
            binary_needs_text=self._binary_needs_text,
        )

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
