"""Reports conflicts: one log event each, the Prometheus counter, the conflict table.

The event's message is PostgreSQL's (``conflict detected on relation
"public.t": conflict=update_missing``), logged as an error when the action
is to stop and as a warning otherwise; its fields carry the values cut at 64
bytes. ``pgsub_conflicts_total{subscription,relation,type}`` counts every
conflict, each time it is met (a conflict that stops the apply is met again
on every retry, as PostgreSQL counts it). The conflict table under
``<warehouse>/_pgsub/conflicts`` keeps the full values for repair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import structlog

from conflicts.kinds import Resolution
from conflicts.report import Conflict
from subscriber.metrics import Metrics

log = structlog.get_logger(__name__)


class ConflictTable(Protocol):
    def record(self, subscription: str, conflicts: Sequence[Conflict]) -> None: ...


class ConflictReporter:
    def __init__(self, subscription: str, metrics: Metrics, table: ConflictTable | None) -> None:
        self.subscription = subscription
        self._metrics = metrics
        self._table = table
        # Conflicts by kind since the process started (pg_stat_subscription_stats).
        self.counts: Counter[str] = Counter()

    def report(self, conflicts: Sequence[Conflict]) -> None:
        if not conflicts:
            return
        for conflict in conflicts:
            emit = log.error if conflict.resolution is Resolution.ERROR else log.warning
            emit(conflict.message, subscription=self.subscription, **conflict.log_fields())
            self._metrics.conflicts.labels(
                self.subscription, conflict.relation, conflict.kind.value
            ).inc()
            self.counts[conflict.kind.value] += 1
        if self._table is not None:
            self._table.record(self.subscription, conflicts)
