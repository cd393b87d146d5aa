"""The apply package's errors: each names what failed and where, and says what to do.

``ApplyError`` is what the leader catches around a batch: the batch is not
confirmed upstream, the error is logged with the remote transaction it
concerns (its finish LSN is what ``pgsub skip`` takes), and the worker
retries after ``wal_retrieve_retry_interval``, as PostgreSQL's does.
"""

from __future__ import annotations

from conflicts.findings import Finding


class ApplyError(Exception):
    """A batch could not be applied."""


class TargetTableError(ApplyError):
    """A Delta table is missing, unreadable or cannot take a change."""


class CommitRacedError(TargetTableError):
    """Another writer made the version this commit was for; nothing was committed."""


class ConflictError(ApplyError):
    """A remote change conflicts with the target and the configured action is to stop."""

    def __init__(self, kind: str, table: str, findings: list[Finding]) -> None:
        self.kind = kind
        self.table = table
        self.findings = findings
        stopping = [f for f in findings if f.kind == kind]
        self.tx_index = stopping[0].tx_index if stopping else 0
        super().__init__(f'conflict detected on relation "{table}": conflict={kind}')


def as_apply_error(exc: Exception) -> ApplyError:
    """Any failure of a table's write, as an apply error (a bug's type stays in its text)."""
    if isinstance(exc, ApplyError):
        return exc
    return ApplyError(f"{type(exc).__name__}: {exc}")
