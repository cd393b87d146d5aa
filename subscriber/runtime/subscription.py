"""Runs one subscription: the receiver and the leader apply worker, restarted on errors.

Two threads per attempt: the receiver (stream, decode, assemble complete
transactions, put them on the queue) and the apply worker (batches into
Delta, then confirms the flush position). When either fails, both stop;
the error is logged and counted, and a new attempt starts from the last
confirmed position after ``wal_retrieve_retry_interval`` - what PostgreSQL's
launcher does for a failed apply worker - doubled with each further failure
that made no progress, up to ``max_retry_interval`` (``subscriber.runtime.backoff``).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import psycopg
import structlog

from apply.arrival.assembly import UnsupportedStreamError
from apply.arrival.spool import private_directory
from apply.arrival.spool_layout import SpoolLayout
from apply.batching.error_context import TransactionError
from apply.core.backoff import retry_delay
from apply.core.errors import ApplyError
from apply.core.maintenance_policy import DEFAULT_POLICY, MaintenancePolicy
from apply.core.roles import Leader, PreparedLeftovers
from apply.delta.state_store import (
    CheckpointStore,
)
from apply.worker.pipeline import ApplyPipeline
from apply.worker.worker import ApplyWorker
from subscriber.metrics import Metrics
from subscriber.replication import session
from subscriber.replication.catalog import prepared_transactions
from subscriber.replication.errors import ReplicationError, SubscriberError
from subscriber.replication.lsn import Lsn
from subscriber.replication.progress import Progress
from subscriber.replication.receiver import Receiver
from subscriber.runtime.config import SubscriptionConfig
from subscriber.runtime.sampler import StatusSampler
from subscriber.runtime.settings import REFRESH_INTERVAL
from subscriber.runtime.slots import Heartbeat, SlotWatch
from subscriber.runtime.subscription_status import SubscriptionStatus, lsn_text
from subscriber.runtime.wiring import wire
from tablesync.coordinator import SyncCoordinator
from tablesync.initial_load import InitialLoad
from tablesync.publication import PublicationError, PublishedTable, published_tables
from tablesync.resume import forget_staged
from tablesync.state import TableState
from tablesync.worker import SyncWorker

if TYPE_CHECKING:
    from apply.delta.spark.session import SparkSession

log = structlog.get_logger(__name__)

# A supervising thread that has not gone round its loop for this long is hung.
HEARTBEAT_LIMIT = 120.0

_FAILURES = (
    ApplyError,
    SubscriberError,
    UnsupportedStreamError,
    PublicationError,
    psycopg.OperationalError,
)


class SubscriptionRunner:
    """Keeps one subscription replicating until stopped."""

    def __init__(
        self,
        config: SubscriptionConfig,
        spark: SparkSession,
        warehouse: str,
        checkpoints: CheckpointStore,
        metrics: Metrics,
        *,
        maintenance: MaintenancePolicy = DEFAULT_POLICY,
        spark_sees_warehouse: bool | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        parts = wire(config, spark, warehouse, metrics, maintenance, spark_sees_warehouse)
        self._conninfo = parts.conninfo
        self.spool = parts.spool
        self._checkpoints = checkpoints
        self._metrics = metrics
        self.settings = parts.settings
        self.tables = parts.tables
        self.catalog = parts.catalog
        self.slots = parts.slots
        self.reporter = parts.reporter
        self._prepared = parts.prepared
        self.options = parts.options
        self.context = parts.context
        self.coordinator = SyncCoordinator(
            config.sync_settings(),
            parts.table_states,
            metrics,
            self._sync_worker,
            drop_sync_slot=self.slots.drop_sync_slot,
            list_published=self._published_tables,
            on_error=self._sync_failed,
        )
        self._loaded = False
        self.status = SubscriptionStatus(config.name, slot=config.slot)
        self.slot_watch = SlotWatch(config, self.catalog, metrics, self.status)
        self.publisher_heartbeat = Heartbeat(config, self._conninfo)
        self.sampler = StatusSampler(
            self.status,
            metrics,
            settings=self.settings,
            coordinator=self.coordinator,
            reporter=self.reporter,
            watches=(self.slot_watch, self.publisher_heartbeat),
            writes=parts.context.writes,
        )
        self.table_files = self.sampler.table_files  # maintenance fills it
        # Unix time the supervising thread last went round its loop (liveness).
        self.heartbeat = time.time()
        self.progress: Progress | None = None
        self.receiver: Receiver | None = None
        self._worker: ApplyWorker | None = None
        self._spool_cleaned = False

    # -- supervision ---------------------------------------------------------

    def run(self, stopping: threading.Event) -> None:
        name = self.name
        self._begin()
        flushed: Lsn | None = None
        isolate: tuple[Lsn, int] | None = None  # after a failed batch: (its end, batch size)
        failures = 0
        while not stopping.is_set():
            failed = False
            started_at = flushed
            try:
                if not self._wait_enabled(stopping):
                    break
                if flushed is None:
                    flushed = self._checkpoints.origin_lsn(name)
                    log.info("subscription starting", subscription=name, origin_lsn=str(flushed))
                self._forget_done_skip(flushed)
                self._prepare_spool()
                self._start(flushed, stopping)
                flushed = self._attempt(flushed, isolate, stopping)
                isolate = None
            except TransactionError as exc:
                isolate = (exc.batch.end_lsn, max(1, len(exc.batch.transactions) // 2))
                self._failed(exc, finish_lsn=exc.finish_lsn)
                failed = True
            except _FAILURES as exc:
                self._failed(exc)
                failed = True
            except Exception as exc:  # a bug must not stop the subscription for good
                log.exception("unexpected error in the subscription; retrying", subscription=name)
                self._failed(exc)
                failed = True
            if failed and self.config.disable_on_error:
                self._disable(self.status.last_error or "")
                continue
            if self.progress is not None:
                flushed = self.progress.flushed
            if stopping.is_set():
                break
            moved = flushed is not None and started_at is not None and flushed > started_at
            failures = failures + 1 if failed and not moved else int(failed)
            self.status.consecutive_failures = failures
            self._metrics.consecutive_failures.labels(name).set(failures)
            delay = retry_delay(
                failures, self.config.wal_retrieve_retry_interval, self.config.max_retry_interval
            )
            self.status.retry_at = time.time() + delay if failed else None
            self._pause(stopping, delay if failed else self.config.wal_retrieve_retry_interval)
            self.status.retry_at = None
        self.coordinator.stop()
        self.status.state = "stopped"
        self.catalog.close()
        self.tables.close()

    def _begin(self) -> None:
        """The subscription shown enabled."""
        self._metrics.subscription_enabled.labels(self.name).set(1)

    def _resume_point(self, flushed: Lsn) -> Lsn:
        """Where the leader stands as it starts, for the table-sync handoff: past ``flushed``
        (the last checkpoint row, up to ``checkpoint_interval`` old) when its slot confirmed
        more.

        The publisher streams no transaction that committed before the slot's confirmed
        position (but for one prepared before two-phase was on, sent whole at its COMMIT
        PREPARED, which the stream still starts at ``flushed`` for), so that is the
        leader's position before it has received a thing. A table-sync worker handed
        CATCHUP at an older one would stop short of it, and the changes between - skipped
        by the last leader, the table not yet its - would be nobody's.
        """
        confirmed = self.slots.confirmed
        if confirmed <= flushed:
            return flushed
        log.info(
            "subscription resumes at its slot's confirmed position",
            subscription=self.name,
            origin_lsn=str(flushed),
            confirmed_lsn=str(confirmed),
        )
        return confirmed

    def _start(self, flushed: Lsn, stopping: threading.Event) -> None:
        """The slot checked (made on the first start), the tables to sync known; on the first
        start, the small tables copied under the new slot's snapshot (tablesync.initial_load)."""
        exported = self.slots.ensure(
            flushed, export_snapshot=self.config.copy_data and self.config.initial_copy.initial_load
        )
        try:
            published = self._tables_to_sync(flushed)
            # Its writer processes, if any (``auto``: by its tables), started once, beside
            # its first copies: the threads write until they are up.
            self.tables.start_writers(len(published))
            if exported is not None:
                self._two_phase()  # pending while the tables are copied, as PostgreSQL's
                InitialLoad(
                    self.context,
                    self.coordinator,
                    snapshot=exported.name,
                    lsn=exported.lsn,
                    copy=self.config.initial_copy.settings(),
                    workers=self.config.max_sync_workers,
                ).run(published, stopping, beat=self._loading)
        finally:
            if exported is not None:
                exported.close()

    def _loading(self) -> None:
        """The supervising thread, alive while the first start's load runs."""
        self.heartbeat = time.time()
        self.sampler.describe_tables()

    def _prepare_spool(self) -> None:
        """The spool directory, private to this user; copies a killed run staged, removed."""
        base = self.spool
        for directory in ([base.parent] if self.config.spool_dir is None else []) + [base]:
            private_directory(directory)
        if not self._spool_cleaned:
            for scratch in SpoolLayout(base).left_by_a_killed_run:
                shutil.rmtree(scratch, ignore_errors=True)
            self._spool_cleaned = True

    def _pause(self, stopping: threading.Event, seconds: float) -> bool:
        """Wait ``seconds`` (alive all along, the slot watched); True when stopping."""
        deadline = time.monotonic() + seconds
        while not stopping.wait(max(0.0, min(1.0, deadline - time.monotonic()))):
            self.heartbeat = time.time()
            self.slot_watch.sample()
            if time.monotonic() >= deadline:
                return False
        return True

    def stuck(self, now: float) -> str | None:
        """Why this subscription cannot make progress, if it cannot (``/healthz``)."""
        if now - self.heartbeat > HEARTBEAT_LIMIT:
            return f"its supervising thread has not run for {now - self.heartbeat:.0f} s"
        worker = self._worker
        in_flight = worker.in_flight_since if worker is not None else None
        if in_flight is not None and now - in_flight > self.config.apply_timeout:
            return (
                f"a batch has been in flight for {now - in_flight:.0f} s "
                f"(apply_timeout {self.config.apply_timeout:.0f} s)"
            )
        receiver = self.receiver
        if receiver is not None and receiver.streaming.is_set() and receiver.last_receipt:
            silent = now - receiver.last_receipt
            # The stream itself gives up after wal_receiver_timeout and reconnects.
            if silent > 2 * self.config.wal_receiver_timeout + 30:
                return f"the publisher has been silent for {silent:.0f} s and no reconnect began"
        return None

    def _forget_done_skip(self, origin: Lsn) -> None:
        """A skip below the origin LSN was done: its transaction is never sent again.

        The skip's checkpoint and the clearing of the setting are two commits; a
        crash between them leaves the setting, which must not skip anything else.
        """
        skip = self.settings.skip_lsn
        if skip is not None and skip < origin:
            self.settings.clear_skip()
            log.info(
                "logical replication completed skipping transaction",
                subscription=self.name,
                skip_lsn=str(skip),
                origin_lsn=str(origin),
            )

    def _disable(self, cause: str) -> None:
        """disable_on_error: PostgreSQL disables the subscription instead of retrying."""
        self.settings.set_enabled(False)
        log.error(
            f'subscription "{self.name}" has been disabled because of an error',
            subscription=self.name,
            error=cause,
            hint=f"fix the cause, then `pgsub enable -c ... {self.name}`",
        )

    def _sync_failed(self, cause: str) -> bool:
        """A table-sync worker failed: with disable_on_error the whole subscription stops."""
        if not self.config.disable_on_error:
            return False
        self.status.last_error = cause
        self._disable(cause)
        return True

    def _wait_enabled(self, stopping: threading.Event) -> bool:
        """Wait while the subscription is disabled (``pgsub disable``); False when stopping."""
        self.settings.refresh(force=True)
        if not self.settings.enabled:
            self.status.state = "disabled"
            self.status.enabled = False
            self._metrics.subscription_enabled.labels(self.name).set(0)
            log.info("subscription disabled", subscription=self.name)
            while not self.settings.enabled:
                if self._pause(stopping, REFRESH_INTERVAL):
                    return False
                self.settings.refresh(force=True)
            log.info("subscription enabled", subscription=self.name)
        self.coordinator.resume()
        self._metrics.subscription_enabled.labels(self.name).set(1)
        return True

    def _failed(self, exc: BaseException, finish_lsn: Lsn | None = None) -> None:
        self._metrics.apply_errors.labels(self.name).inc()
        self.status.state = "error"
        self.status.last_error = str(exc)
        self.status.last_error_at = time.time()
        self.status.last_error_finish_lsn = finish_lsn
        self.status.error_count += 1
        log.error(
            "logical replication apply worker failed",
            subscription=self.name,
            error=str(exc),
            error_type=type(exc).__name__,
            finish_lsn=lsn_text(finish_lsn),
            attempt=self.status.consecutive_failures + 1,
        )

    def _sync_worker(self, table: PublishedTable) -> Callable[[threading.Event], None]:
        return SyncWorker(
            self.context,
            table,
            handoff=self.coordinator,
            system_id=self.slots.system_id,
            copy=self.config.initial_copy.settings(),
        ).run

    def _published_tables(self) -> list[PublishedTable]:
        with session.connect(self._conninfo) as conn:
            return published_tables(conn, list(self.config.publications))

    def _tables_to_sync(self, position: Lsn) -> list[PublishedTable]:
        """The publications' tables (returned); the first time, the stored table states too."""
        published = self._published_tables()
        if self._loaded:
            self.coordinator.publish(published)
            self.coordinator.reload()  # a resync may be the way out of the last error
        else:
            self.coordinator.load(published, position)
            self._loaded = True
            copying = {
                s.relid
                for s in self.coordinator.statuses
                if s.state not in (TableState.SYNCDONE, TableState.READY)
            }
            self.slots.drop_leftover_sync_slots(copying)
            forget_staged(self.spool, copying)
        return published

    # -- one attempt ---------------------------------------------------------

    def _two_phase(self) -> bool:
        """Whether this attempt streams with two-phase on (``advance_two_phase``)."""
        wanted, slot = self.config.two_phase, self.config.slot
        state = self.settings.advance_two_phase(wanted, self._all_ready(), slot)
        self.status.two_phase = state
        return state == "enabled"

    def _attempt(
        self, flushed: Lsn, isolate: tuple[Lsn, int] | None, stopping: threading.Event
    ) -> Lsn:
        two_phase = self._two_phase()
        context = replace(self.context, options=replace(self.options, two_phase=two_phase))
        resumed_at = self._resume_point(flushed)

        def sync_tables(position: Lsn, confirmed: Lsn) -> None:
            self.coordinator.process(max(position, resumed_at), max(confirmed, resumed_at))

        leader = Leader(
            slot=self.config.slot,
            checkpoints=self._checkpoints,
            should_apply=self.coordinator.should_apply,
            table_states=lambda: self.coordinator.statuses,
            sync_tables=sync_tables,
            skip=self.settings,
            isolate_through=isolate[0] if isolate else None,
            isolate_size=isolate[1] if isolate else 1,
            checkpoint_interval=self.config.checkpoint_interval,
            prepared=self._prepared if two_phase else None,
            prepared_leftovers=self._prepared_leftovers() if two_phase else None,
        )
        pipeline = ApplyPipeline(context, leader, flushed)
        progress = pipeline.progress
        self.progress, self.receiver = progress, pipeline.receiver
        pipeline.start()
        self._metrics.workers.labels(self.name, "apply").set(1)
        self._worker = pipeline.worker
        self.coordinator.wake_leader = pipeline.wake
        try:
            while not pipeline.done.wait(0.5):
                self.heartbeat = time.time()
                self.sampler.sample(pipeline.receiver, progress, pipeline.worker)
                if stopping.is_set():
                    break
                self.settings.refresh()
                if not self.settings.enabled:
                    self.status.state = "disabled"  # said at once; the stop follows
                    break  # pgsub disable: stop, then wait to be enabled
                if self.config.two_phase and not two_phase and self._all_ready():
                    break  # every table READY: start again, with two-phase on
        finally:
            self.coordinator.wake_leader = lambda: None
            failures = pipeline.stop()
            self._worker = None
            self._metrics.workers.labels(self.name, "apply").set(0)
            self._metrics.streaming.labels(self.name).set(0)
        self.sampler.sample(pipeline.receiver, progress, pipeline.worker)
        if failures:
            raise failures[0]
        two_phase_due = self.config.two_phase and not two_phase and self._all_ready()
        if not stopping.is_set() and self.settings.enabled and not two_phase_due:
            raise ReplicationError("the apply worker stopped unexpectedly")
        return progress.flushed

    def _prepared_leftovers(self) -> PreparedLeftovers | None:
        """Stagings the publisher no longer holds prepared (see ``PreparedLeftovers``)."""
        staged = self._prepared.staged(self.name)
        if not staged:
            return None
        with session.connect(self._conninfo) as conn:
            upstream, seen_at = prepared_transactions(conn)
        stale = tuple(s for s in staged if s not in upstream)
        return PreparedLeftovers(stale, seen_at) if stale else None

    def _all_ready(self) -> bool:
        return all(s.state is TableState.READY for s in self.coordinator.statuses)

    @property
    def ready(self) -> bool:
        receiver = self.receiver
        return receiver is not None and receiver.streaming.is_set()
