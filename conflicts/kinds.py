"""Conflict kinds, their default actions, and how a batch's chain is judged. Pure.

PostgreSQL 18's conflict.c, for a Delta target (docs/conflicts.md):

| kind | when | default |
|---|---|---|
| insert_exists | a remote insert finds its key already in the table | error |
| update_exists | an update's new key is already in the table | error |
| update_missing | the row an update changes is not there | skip |
| delete_missing | the row a delete removes is not there | skip |
| update_origin_differs | the row was last changed by another writer | apply_remote |
| delete_origin_differs | likewise for a delete | apply_remote |

A key's chain of changes in a batch is judged on its first change against
the table as it was before the batch (``First``, kept by ``apply.batching.collapse``). An update or
delete whose row another writer changed last is *_origin_differs: Delta row
tracking gives each row the table version that last changed it, and the
table's history says which versions were not this subscription's commits.
"""

from __future__ import annotations

from enum import Enum
from typing import Final


class First(Enum):
    """The first change of a key's chain within the batch."""

    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    KEY_UPDATE_NEW = "KEY_UPDATE_NEW"  # the new key of an update that changed the key
    KEY_UPDATE_OLD = "KEY_UPDATE_OLD"  # the old key of such an update

    @property
    def expects_present(self) -> bool:
        """Whether the publisher had the row before this change."""
        return self in (First.UPDATE, First.DELETE, First.KEY_UPDATE_OLD)


class ConflictKind(Enum):
    INSERT_EXISTS = "insert_exists"
    UPDATE_EXISTS = "update_exists"
    UPDATE_MISSING = "update_missing"
    DELETE_MISSING = "delete_missing"
    UPDATE_ORIGIN_DIFFERS = "update_origin_differs"
    DELETE_ORIGIN_DIFFERS = "delete_origin_differs"


class Resolution(Enum):
    ERROR = "error"
    SKIP = "skip"
    APPLY_REMOTE = "apply_remote"
    KEEP_LOCAL = "keep_local"


DEFAULTS: Final = {
    ConflictKind.INSERT_EXISTS: Resolution.ERROR,
    ConflictKind.UPDATE_EXISTS: Resolution.ERROR,
    ConflictKind.UPDATE_MISSING: Resolution.SKIP,
    ConflictKind.DELETE_MISSING: Resolution.SKIP,
    ConflictKind.UPDATE_ORIGIN_DIFFERS: Resolution.APPLY_REMOTE,
    ConflictKind.DELETE_ORIGIN_DIFFERS: Resolution.APPLY_REMOTE,
}

# The operation PostgreSQL's CONTEXT line names for each first change.
OPERATION: Final = {
    First.INSERT: "INSERT",
    First.UPDATE: "UPDATE",
    First.DELETE: "DELETE",
    First.KEY_UPDATE_NEW: "UPDATE",
    First.KEY_UPDATE_OLD: "UPDATE",
}


def judge(first: First, found: bool, foreign: bool = False) -> ConflictKind | None:
    """The conflict of a chain whose first change is ``first``.

    ``found``: the key is in the table before the batch; ``foreign``: that
    row was last changed by another writer of the Delta table.
    """
    if first.expects_present == found:
        if found and foreign:
            if first is First.DELETE:
                return ConflictKind.DELETE_ORIGIN_DIFFERS
            return ConflictKind.UPDATE_ORIGIN_DIFFERS
        return None
    if first is First.INSERT:
        return ConflictKind.INSERT_EXISTS
    if first is First.KEY_UPDATE_NEW:
        return ConflictKind.UPDATE_EXISTS
    if first is First.DELETE:
        return ConflictKind.DELETE_MISSING
    return ConflictKind.UPDATE_MISSING
