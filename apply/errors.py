"""The apply package's errors: each names what failed and where, and says what to do.

``ApplyError`` is what the leader catches around a batch: the batch is not
confirmed upstream, the error is logged with the remote transaction it
concerns (its finish LSN is what ``pgsub skip`` takes), and the worker
retries after ``wal_retrieve_retry_interval``, as PostgreSQL's does.
"""

from __future__ import annotations


class ApplyError(Exception):
    """A batch could not be applied."""


class TargetTableError(ApplyError):
    """A Delta table is missing, unreadable or cannot take a change."""
