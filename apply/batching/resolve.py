"""What each configured action does to a batch's net effect, before the MERGE. Pure.

The writer looks the batch's keys up first (``apply.delta.spark.findings``) when
an action needs a decision per key that one MERGE cannot make; ``resolve``
then cuts the net effect so that the MERGE applies exactly what PostgreSQL's
apply worker would have applied change by change:

- insert_exists, update_exists: skip / keep_local leave out the first change
  (the insert, or the move onto the taken key); later changes of the key
  apply to the local row. apply_remote: the remote row overwrites.
- update_missing: skip / keep_local leave the update out; apply_remote
  inserts the remote row when it is whole (no unchanged TOAST value).
- delete_missing: nothing to delete, whatever the action but error.
- *_origin_differs: skip / keep_local keep the local row; apply_remote
  applies the remote change.
- error, for every kind: stop before anything is written.

A chain whose first change cannot be cut out of the batch alone (the other
half of a key change has later changes of its own) is applied as
``apply_remote``, and its conflict reports that action.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from apply.batching.collapse import Key, KeyedNet, KeyedRow
from conflicts.findings import Finding
from conflicts.kinds import ConflictKind, First, Resolution
from subscriber.replication.messages import UNCHANGED

EXISTS: Final = frozenset({ConflictKind.INSERT_EXISTS, ConflictKind.UPDATE_EXISTS})
ORIGIN: Final = frozenset({ConflictKind.UPDATE_ORIGIN_DIFFERS, ConflictKind.DELETE_ORIGIN_DIFFERS})
_KEEP: Final = frozenset({Resolution.SKIP, Resolution.KEEP_LOCAL})


@dataclass(frozen=True, slots=True)
class Resolved:
    net: KeyedNet  # what the MERGE applies
    findings: tuple[Finding, ...]  # every conflict, with the action taken
    stop: Finding | None  # the first conflict whose action is to stop


def looks_up_first(resolutions: Mapping[ConflictKind, Resolution]) -> bool:
    """Whether the actions need the batch's keys looked up before the MERGE.

    The defaults do not: the MERGE itself stops on *_exists, skips what is
    missing and applies over other writers' rows; what it met is found
    after it, only when its counts say so.
    """
    return (
        any(resolutions[kind] in _KEEP for kind in EXISTS)
        or resolutions[ConflictKind.UPDATE_MISSING] in (Resolution.APPLY_REMOTE, Resolution.ERROR)
        or resolutions[ConflictKind.DELETE_MISSING] is Resolution.ERROR
    )


def origin_looks_up_first(resolutions: Mapping[ConflictKind, Resolution]) -> bool:
    return any(resolutions[kind] is not Resolution.APPLY_REMOTE for kind in ORIGIN)


def resolve(
    net: KeyedNet, findings: Sequence[Finding], resolutions: Mapping[ConflictKind, Resolution]
) -> Resolved:
    rows = dict(net.rows)
    taken: list[Finding] = []
    stop: Finding | None = None
    for finding in sorted(findings, key=lambda f: f.tx_index):
        kind = ConflictKind(finding.kind)
        action = resolutions[kind]
        chain = net.rows[finding.key]
        if action is Resolution.ERROR:
            stop = stop or finding
        elif kind is ConflictKind.UPDATE_MISSING:
            action = _update_missing(rows, chain, action)
        elif action in _KEEP and (kind in EXISTS or kind in ORIGIN):
            cut = _skip_first_change if kind in EXISTS else _keep_local
            if not cut(rows, chain):
                action = Resolution.APPLY_REMOTE
        taken.append(replace(finding, resolution=action.value))
    resolved = KeyedNet(
        net.relation,
        net.key_columns,
        rows,
        net.truncated,
        net.key_kinds,
        net.truncate_tx,
        net.commits,
    )
    return Resolved(resolved, tuple(taken), stop)


def _partner(rows: dict[Key, KeyedRow], chain: KeyedRow) -> KeyedRow | None:
    """The other half of the key change that began ``chain``, if it is still only that."""
    if chain.partner is None:
        return None
    partner = rows.get(chain.partner)
    if partner is None or partner.partner != chain.key or partner.changes != 1:
        return None
    return partner


def _skip_first_change(rows: dict[Key, KeyedRow], chain: KeyedRow) -> bool:
    """Leave out an insert (or a move onto the key) that found the key taken."""
    if chain.partner is not None:
        partner = _partner(rows, chain)
        if partner is None:
            return False
        del rows[partner.key]  # the row keeps its old key
    if chain.changes == 1:
        del rows[chain.key]
    # Otherwise the later changes apply to the local row, as they would in PostgreSQL.
    return True


def _keep_local(rows: dict[Key, KeyedRow], chain: KeyedRow) -> bool:
    """Leave out every change of a row another writer changed last."""
    if chain.reinserted:
        return False
    if chain.partner is not None:
        partner = _partner(rows, chain)
        if partner is None:
            return False
        del rows[partner.key]
    del rows[chain.key]
    return True


def _update_missing(rows: dict[Key, KeyedRow], chain: KeyedRow, action: Resolution) -> Resolution:
    if action is Resolution.APPLY_REMOTE:
        if chain.first is First.KEY_UPDATE_OLD or not chain.present:
            return action  # the new key's insert, or nothing left to insert
        if chain.image is None or UNCHANGED in chain.image.kinds:
            return Resolution.SKIP  # no whole row to insert
        rows[chain.key] = replace(chain, reinserted=True)
        return action
    if chain.first is First.KEY_UPDATE_OLD and chain.partner is not None:
        moved = rows.get(chain.partner)
        if (
            moved is not None
            and moved.first is First.KEY_UPDATE_NEW
            and moved.partner == chain.key
            and not moved.reinserted
        ):
            del rows[moved.key]  # the skipped update does not bring the row to its new key
    return action
