"""The daemon's maintenance thread: every subscription's tables and ``_pgsub/``, in turn.

Once per ``maintenance.interval`` it tends each target table a subscription
has prepared (``DeltaTables.tend``: compaction past ``compact_files``,
VACUUM once per ``vacuum_interval`` or four times per ``retention``,
whichever is more often - pgsub's own where it reaches the warehouse,
else Spark's LITE, and a full one once per ``retention`` -, history
bounded to ``retention``), then the state tables, and prunes checkpoint
rows past the retention. What commits (compaction, properties, the
prune) is done under the table's write lock, never beside its own MERGE
or checkpoint, and only when due; VACUUM commits nothing and runs beside
them.
A round's tables are spread over half its interval (``SPREAD``), as
PostgreSQL's autovacuum paces itself (``autovacuum_vacuum_cost_delay``): one
after another, 200 tables' VACUUMs in a bucket took 106 s of the daemon's
two cores at once, and the mean batch beside them was 1.4-1.6 times longer
(docs/performance.md, "A round spread over its interval"). A round behind
its pace (long tends, thousands of tables) waits for nothing; the next
round starts one interval after this one started, and at least half an
interval after it ended.
The receivers keep streaming meanwhile. One failure is logged and counted
(``pgsub_maintenance_errors_total``) and retried next round; it never stops
replication.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final

import structlog

from apply.core.errors import ApplyError
from apply.delta.spark.maintenance import Tended, is_delta_table, tend
from apply.delta.state_store import STATE_TABLES, CheckpointStore
from subscriber.metrics import Metrics
from subscriber.runtime.config import MaintenanceConfig
from subscriber.runtime.subscription import SubscriptionRunner

log = structlog.get_logger(__name__)

# The subscription label of the state tables under _pgsub/.
STATE = "_pgsub"
# A round's tables are spread over this share of its interval (see the module).
SPREAD: Final = 0.5


def _unmarked() -> None:
    """The state tables' commits carry no subscription's mark."""


@dataclass(slots=True)
class _Pace:
    """A round's ``count`` tables spread over ``spread`` seconds from ``started``: a table's
    turn not before its share of them (none without ``stopping``: a test's round)."""

    clock: Callable[[], float]
    spread: float
    count: int
    stopping: threading.Event | None
    started: float
    done: int = 0

    def next_turn(self) -> bool:
        """One more table tended: wait for the next one's turn; False if ``stopping`` was
        set meanwhile."""
        self.done += 1
        if self.stopping is None:
            return True
        wait = self.started + self.spread * self.done / max(1, self.count) - self.clock()
        return not self.stopping.wait(wait) if wait > 0 else not self.stopping.is_set()


class Maintenance:
    """The maintenance thread's work: ``run`` until stopped, a ``round`` every interval."""

    def __init__(
        self,
        runners: Sequence[SubscriptionRunner],
        spark: Any,
        warehouse: str,
        config: MaintenanceConfig,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runners = runners
        self._spark = spark
        self._warehouse = warehouse
        self._config = config
        self._policy = config.policy()
        self._metrics = metrics
        self._clock = clock
        self._vacuumed: dict[tuple[str, str], float] = {}
        self._fully_vacuumed: dict[tuple[str, str], float] = {}
        self._started = clock()

    def run(self, stopping: threading.Event) -> None:
        """A ``round`` one interval after the start, then one interval after each round's
        start (a paced round takes ``SPREAD`` of it) and at least ``1 - SPREAD`` of an
        interval after its end; until ``stopping`` is set."""
        interval = self._config.interval
        wait = interval
        while not stopping.wait(wait):
            started = self._clock()
            self.round(stopping)
            wait = max(interval * (1 - SPREAD), started + interval - self._clock())

    def round(self, stopping: threading.Event | None = None) -> None:
        """Tend every table once (stops early when ``stopping`` is set), spread over
        ``SPREAD`` of the interval when run with ``stopping`` (a test's round is not)."""
        tables = [(runner, table) for runner in self._runners for table in runner.tables.known()]
        pace = _Pace(
            self._clock,
            self._config.interval * SPREAD,
            len(tables) + len(STATE_TABLES),
            stopping,
            started=self._clock(),
        )
        for runner, table in tables:
            if stopping is not None and stopping.is_set():
                return
            done = self._tend(runner.name, table, partial(runner.tables.tend, table, self._policy))
            if done is not None:
                runner.table_files[table] = done.files_after  # its /status
            if not pace.next_turn():
                return
        retained = datetime.now(UTC) - timedelta(seconds=self._policy.retention)
        checkpoints = CheckpointStore(self._spark, self._warehouse)
        for runner in self._runners:
            try:
                checkpoints.prune(runner.name, retained)
                self._metrics.maintenance.labels(STATE, checkpoints.name, "prune").inc()
            except ApplyError as exc:
                self._failed(STATE, checkpoints.name, exc)
        for kind in STATE_TABLES:
            store = kind(self._spark, self._warehouse)
            if not is_delta_table(self._spark, store.path):
                continue  # not written yet (no conflict so far, say)
            # In the table's writer turn, which its appends take too: a compaction and a
            # checkpoint recorded meanwhile failed one another (the 150-minute soak).
            work = partial(tend, self._spark, store.path, self._policy, mark=_unmarked)
            self._tend(STATE, kind.name, partial(work, held=store.writing))
            if not pace.next_turn():
                return

    def _tend(self, subscription: str, table: str, work: Callable[..., Tended]) -> Tended | None:
        """``work(vacuum=...)`` tends the table; its outcome counted, logged and returned
        (None when it failed)."""
        key = (subscription, table)
        now = self._clock()
        # A daemon's first vacuum of a table comes one interval after it started.
        vacuum = now - self._vacuumed.get(key, self._started) >= self._policy.vacuum_every
        # A full VACUUM lists the whole folder (tens of seconds for a small table on a local
        # Spark); LITE reads the log. Full once per retention, for the files no commit names.
        full = now - self._fully_vacuumed.get(key, self._started) >= self._policy.retention
        try:
            done = work(vacuum=vacuum, lite=not full)
        except ApplyError as exc:
            self._failed(subscription, table, exc)
            return None
        if vacuum:
            self._vacuumed[key] = now
            if full:
                self._fully_vacuumed[key] = now
        metrics = self._metrics
        metrics.table_files.labels(subscription, table).set(done.files_after)
        metrics.maintenance_duration.labels(subscription).observe(done.seconds)
        for operation, did in (("optimize", done.compacted), ("vacuum", done.vacuumed)):
            if did:
                metrics.maintenance.labels(subscription, table, operation).inc()
        if done.compacted or done.vacuumed:
            log.info(
                "table maintained",
                subscription=subscription,
                table=table,
                compacted=done.compacted,
                vacuumed=done.vacuumed,
                deleted=done.deleted,
                files_before=done.files_before,
                files_after=done.files_after,
                seconds=round(done.seconds, 3),
            )
        return done

    def _failed(self, subscription: str, table: str, exc: Exception) -> None:
        self._metrics.maintenance_errors.labels(subscription, table).inc()
        log.warning(
            "table maintenance failed; it is tried again next round",
            subscription=subscription,
            table=table,
            error=str(exc),
        )
