"""What each kind of conflict meets in a subscription, and how a write's conflicts are reported.

A write (``apply.plans.tables.Tables``) returns the conflicts it met as findings;
``ConflictHandling.report`` gives each its resolution - the one the write
took, or the subscription's for its kind, or ``error`` for the kind that
stopped the write - and hands them to the reporter (the log, the metrics,
the conflict table) in PostgreSQL's terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from apply.batching.error_context import conflict_of
from apply.columns.schema import TargetSchema
from apply.core.batch import Batch
from conflicts.findings import Finding
from conflicts.kinds import DEFAULTS, ConflictKind, Resolution
from conflicts.reporter import ConflictReporter


@dataclass(frozen=True, slots=True)
class ConflictHandling:
    """What each kind of conflict meets (``conflicts.resolutions``), and who reports it."""

    resolutions: Mapping[ConflictKind, Resolution] = field(default_factory=lambda: dict(DEFAULTS))
    reporter: ConflictReporter | None = None

    def report(
        self,
        findings: Sequence[Finding],
        schema: TargetSchema,
        batch: Batch,
        stopping: str | None = None,
    ) -> None:
        """``findings`` of a write to ``schema``'s table; ``stopping``: the kind that failed
        the write (reported with resolution ``error``)."""
        if self.reporter is None or not findings:
            return
        conflicts = []
        for finding in findings:
            kind = ConflictKind(finding.kind)
            if finding.kind == stopping:
                resolution = Resolution.ERROR
            elif finding.resolution is not None:
                resolution = Resolution(finding.resolution)
            else:
                resolution = self.resolutions[kind]
            conflicts.append(conflict_of(finding, kind, resolution, schema, batch))
        self.reporter.report(conflicts)
