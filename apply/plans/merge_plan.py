"""MERGE statements as values (pure): conditions and clauses, and their ``MERGE INTO`` SQL.

A keyed table's MERGE matches the source (``s``, one row per key, see
``apply.batching.source``) to the target (``t``) on the key and, in order:

1. when matched and the chain expected no row (an insert, or the new key of
   an update that changed it): the conflict insert_exists / update_exists.
   With the default ``error`` the clause calls ``raise_error``, which aborts
   the whole MERGE before anything is committed - so the conflict-free path
   pays nothing for detection;
2. when matched and the row is gone at the end of the batch: delete;
3. when matched: update every column, keeping the target's value where the
   publisher did not send one (unchanged TOAST);
4. when not matched and the row exists at the end: insert - if the chain
   began with an insert (or re-inserted the key). A chain that expected a
   row which is not there (update_missing / delete_missing) is skipped.

A clause no row of the batch can take is left out (``Shape``): a batch of
updates is a MERGE with one matched-update clause. When the first key
column is an integer, the condition also bounds the target's key to the
batch's smallest and largest key (``key_bounds``): it changes no match, but
it is a target-only predicate, so Delta skips every file whose key range
(from its statistics) lies outside the batch's - a piece of a large
transaction, or a batch of recent inserts, then reads a few files instead
of the whole table.

A stamped table's MERGE (``stamping``, ``apply.history.stamps``) writes every row
with its change's commit LSN and time; with soft deletes it also marks a
deleted row instead of removing it, and counts a marked row as absent (an
insert of its key brings it back, an update or delete of it is skipped as
a missing row).

A multiset table's MERGE deletes every copy of each row the batch removes
from and inserts the copies that remain or were added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from apply.batching.source import FIRST, PRESENT, REINSERTED, REMOVE, keep_flag
from apply.columns.schema import TargetSchema, quote
from apply.history.changelog import COMMIT_TIME, LSN
from apply.history.stamps import DELETED, Stamping, soft_delete_schema
from apply.history.versions import CURRENT, VALID_FROM, VALID_TO, VALID_TO_TIME, versions_schema
from conflicts.kinds import First

EXPECTS_ABSENT: Final = f"s.{FIRST} IN ('INSERT', 'KEY_UPDATE_NEW')"
CONFLICT_MARK: Final = "pgsub conflict:"


class ClauseKind(Enum):
    MATCHED_UPDATE = "matched_update"
    MATCHED_DELETE = "matched_delete"
    NOT_MATCHED_INSERT = "not_matched_insert"
    NOT_MATCHED_BY_SOURCE_UPDATE = "not_matched_by_source_update"


class OnExists(Enum):
    """What to do when a row the publisher inserted (or moved to a key) already exists."""

    ERROR = "error"  # both insert_exists and update_exists stop the apply
    APPLY_REMOTE = "apply_remote"  # both overwrite the local row
    ERROR_ON_INSERT = "error_on_insert"  # insert_exists stops, update_exists overwrites
    ERROR_ON_UPDATE = "error_on_update"  # update_exists stops, insert_exists overwrites


@dataclass(frozen=True, slots=True)
class Shape:
    """What a keyed source holds, so that the MERGE carries only the clauses it can use.

    Fewer clauses is a cheaper MERGE: without an insert clause Delta joins
    the source and the target with an inner join instead of an outer one,
    and a batch of updates needs no insert_exists check.
    """

    expects_absent: bool = True  # a chain begins with an insert (or the new key of a move)
    inserts: bool = True  # a chain may insert its row
    updates: bool = True  # a chain's row exists at the end
    deletes: bool = True  # a chain's row is gone at the end


def shape_of(source: pa.Table) -> Shape:
    """Which clauses the rows of a keyed source (``apply.batching.source``) can take."""
    absent = pc.is_in(source[FIRST], pa.array([First.INSERT.value, First.KEY_UPDATE_NEW.value]))
    present = source[PRESENT]
    inserting = pc.and_(present, pc.or_(absent, source[REINSERTED]))

    def some(mask: pa.ChunkedArray) -> bool:
        return bool(pc.any(mask).as_py())

    return Shape(some(absent), some(inserting), some(present), some(pc.invert(present)))


# Up to this many rows a source's counts are taken in Python: a dozen Arrow calls cost more
# than a small table's batch of rows (200 tables a batch, each a few rows).
_COUNTED_IN_PYTHON: Final = 256
_FIRSTS_ABSENT: Final = frozenset({First.INSERT.value, First.KEY_UPDATE_NEW.value})


def expected_counts(source: pa.Table) -> tuple[int, int, int]:
    """(inserted, updated, deleted) a conflict-free MERGE of ``source`` reports."""
    if source.num_rows <= _COUNTED_IN_PYTHON:
        counts = [0, 0, 0]
        for first, present in zip(
            source[FIRST].to_pylist(), source[PRESENT].to_pylist(), strict=True
        ):
            absent = first in _FIRSTS_ABSENT
            if present is None:
                continue
            if present:
                counts[0 if absent else 1] += 1
            elif not absent:
                counts[2] += 1
        return counts[0], counts[1], counts[2]
    absent = pc.is_in(source[FIRST], pa.array([First.INSERT.value, First.KEY_UPDATE_NEW.value]))
    present = source[PRESENT]

    def count(mask: pa.ChunkedArray) -> int:
        return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)

    return (
        count(pc.and_(present, absent)),
        count(pc.and_(present, pc.invert(absent))),
        count(pc.and_(pc.invert(present), pc.invert(absent))),
    )


def expected_touched(source: pa.Table) -> int:
    """The rows a conflict-free soft-delete MERGE of ``source`` inserts or updates: every
    present chain, and every chain that deletes a row it expects (never one it deletes)."""
    absent = pc.is_in(source[FIRST], pa.array([First.INSERT.value, First.KEY_UPDATE_NEW.value]))
    present = source[PRESENT]
    marks = pc.or_(present, pc.invert(absent))
    return int(pc.sum(pc.cast(marks, pa.int64())).as_py() or 0)


@dataclass(frozen=True, slots=True)
class Clause:
    kind: ClauseKind
    condition: str | None
    assignments: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MergePlan:
    condition: str
    clauses: tuple[Clause, ...]


def _target(name: str) -> str:
    return f"t.{quote(name)}"


def _source(name: str) -> str:
    return f"s.{quote(name)}"


def key_bounds(source: pa.Table, key: str) -> tuple[int, int] | None:
    """The smallest and largest value of an integer key column of ``source`` (else None)."""
    column = source[key]
    if not pa.types.is_integer(column.type) or len(column) == 0:
        return None
    bounds = pc.min_max(column).as_py()
    low, high = bounds["min"], bounds["max"]
    return None if low is None or high is None else (int(low), int(high))


def keyed_merge(
    schema: TargetSchema,
    keep_columns: tuple[int, ...],
    on_exists: OnExists = OnExists.ERROR,
    shape: Shape = Shape(),
    bounds: tuple[int, int] | None = None,
    *,
    stamping: Stamping = Stamping.NONE,
) -> MergePlan:
    """The MERGE of a keyed source; into a stamped table (``stamping``), a source stamped by
    ``apply.history.stamps.stamped``."""
    soft = stamping.soft
    if not schema.key:
        raise ValueError(f"{schema.table} has no key; use multiset_merge")
    condition = " AND ".join(f"{_target(k)} = {_source(k)}" for k in schema.key)
    if bounds is not None:
        low, high = bounds
        condition += f" AND {_target(schema.key[0])} BETWEEN {int(low)} AND {int(high)}"
    live = f"NOT {_target(DELETED)}"
    clauses: list[Clause] = []
    stopping = {
        OnExists.ERROR: EXPECTS_ABSENT,
        OnExists.ERROR_ON_INSERT: f"s.{FIRST} = 'INSERT'",
        OnExists.ERROR_ON_UPDATE: f"s.{FIRST} = 'KEY_UPDATE_NEW'",
    }.get(on_exists)
    if stopping is not None and shape.expects_absent:
        kind = (
            f"CASE WHEN s.{FIRST} = 'INSERT' THEN '{CONFLICT_MARK}insert_exists' "
            f"ELSE '{CONFLICT_MARK}update_exists' END"
        )
        clauses.append(
            Clause(
                ClauseKind.MATCHED_UPDATE,
                f"({stopping}) AND {live}" if soft else stopping,
                {quote(schema.key[0]): f"raise_error({kind})"},
            )
        )
    stamp = (
        {quote(LSN): _source(LSN), quote(COMMIT_TIME): _source(COMMIT_TIME)}
        if stamping.stamps
        else {}
    )
    if shape.deletes and soft:
        marked = {quote(DELETED): "true", **stamp}
        clauses.append(Clause(ClauseKind.MATCHED_UPDATE, f"NOT s.{PRESENT} AND {live}", marked))
    elif shape.deletes:
        clauses.append(Clause(ClauseKind.MATCHED_DELETE, f"NOT s.{PRESENT}"))
    keep = set(keep_columns)
    updates = {}
    for index, column in enumerate(schema.columns):
        value = _source(column.name)
        if index in keep:
            value = f"CASE WHEN s.{keep_flag(index)} THEN {_target(column.name)} ELSE {value} END"
        updates[quote(column.name)] = value
    alive = {quote(DELETED): "false", **stamp} if soft else stamp
    if shape.updates:
        # A marked row is absent: only a chain that expects no row (or re-inserts) revives it.
        revives = f"s.{PRESENT} AND ({live} OR {EXPECTS_ABSENT} OR s.{REINSERTED})"
        clauses.append(
            Clause(ClauseKind.MATCHED_UPDATE, revives if soft else None, updates | alive)
        )
    if shape.inserts:
        clauses.append(
            Clause(
                ClauseKind.NOT_MATCHED_INSERT,
                f"s.{PRESENT} AND ({EXPECTS_ABSENT} OR s.{REINSERTED})",
                {quote(c.name): _source(c.name) for c in schema.columns} | alive,
            )
        )
    return MergePlan(condition, tuple(clauses))


def soft_resync_merge(schema: TargetSchema, lsn: int) -> MergePlan:
    """A soft-delete table copied again (``pgsub resync``) from a source of its stored
    columns (``apply.history.stamps.copied``): the copy's rows replace theirs, alive; a row the copy
    lacks is marked deleted at the copy's ``lsn`` (its time unknown); a row deleted before
    keeps its mark."""
    stored = soft_delete_schema(schema)
    condition = " AND ".join(f"{_target(k)} = {_source(k)}" for k in schema.key)
    every = {quote(c.name): _source(c.name) for c in stored.columns}
    gone = {quote(DELETED): "true", quote(LSN): str(int(lsn)), quote(COMMIT_TIME): "NULL"}
    return MergePlan(
        condition,
        (
            Clause(ClauseKind.MATCHED_UPDATE, None, every),
            Clause(ClauseKind.NOT_MATCHED_INSERT, None, every),
            Clause(ClauseKind.NOT_MATCHED_BY_SOURCE_UPDATE, f"NOT {_target(DELETED)}", gone),
        ),
    )


def versions_merge(
    schema: TargetSchema,
    truncated: tuple[int, datetime | None] | None,
    *,
    closes: bool,
    bounds: tuple[int, int] | None = None,
) -> MergePlan:
    """Close the table's versions the source closes (its rows whose ``_pgsub_current`` is
    NULL, matched on the key and ``_pgsub_valid_from_lsn``), insert the others; with
    ``truncated``, close every other current version at the TRUNCATE."""
    stored = versions_schema(schema)
    target, source = "t.", "s."
    same = [f"{target}{quote(k)} = {source}{quote(k)}" for k in schema.key]
    from_ = f"{target}{quote(VALID_FROM)} = {source}{quote(VALID_FROM)}"
    condition = " AND ".join(
        [f"{source}{quote(CURRENT)} IS NULL", f"{target}{quote(CURRENT)}", *same, from_]
    )
    if bounds is not None:  # a target-only predicate: files outside the keys' range skipped
        low, high = bounds
        condition += f" AND {target}{quote(schema.key[0])} BETWEEN {int(low)} AND {int(high)}"
    clauses = []
    if closes:
        # A version opened by a piece of this transaction (a spooled one applied in pieces).
        clauses.append(
            Clause(
                ClauseKind.MATCHED_DELETE,
                f"{target}{quote(VALID_FROM)} = {source}{quote(VALID_TO)}",
            )
        )
        closing = {
            quote(VALID_TO): f"{source}{quote(VALID_TO)}",
            quote(VALID_TO_TIME): f"{source}{quote(VALID_TO_TIME)}",
            quote(CURRENT): "false",
        }
        clauses.append(Clause(ClauseKind.MATCHED_UPDATE, None, closing))
    clauses.append(
        Clause(
            ClauseKind.NOT_MATCHED_INSERT,
            f"{source}{quote(CURRENT)} IS NOT NULL",
            {quote(c.name): f"{source}{quote(c.name)}" for c in stored.columns},
        )
    )
    if truncated is not None:
        lsn, time = truncated
        at = "NULL" if time is None else f"TIMESTAMP '{time.isoformat()}'"
        clauses.append(
            Clause(
                ClauseKind.NOT_MATCHED_BY_SOURCE_UPDATE,
                f"{target}{quote(CURRENT)}",
                {quote(VALID_TO): str(int(lsn)), quote(VALID_TO_TIME): at, quote(CURRENT): "false"},
            )
        )
    return MergePlan(condition, tuple(clauses))


def versions_resync_merge(schema: TargetSchema, lsn: int) -> MergePlan:
    """A versions table copied again (``pgsub resync``) from a source of its stored columns
    (``copied``): every current version is closed at the copy's ``lsn`` (its time unknown),
    and every row of the copy opens a version there."""
    stored = versions_schema(schema)
    closing = {
        quote(VALID_TO): str(int(lsn)),
        quote(VALID_TO_TIME): "NULL",
        quote(CURRENT): "false",
    }
    return MergePlan(
        "false",
        (
            Clause(
                ClauseKind.NOT_MATCHED_INSERT,
                None,
                {quote(c.name): f"s.{quote(c.name)}" for c in stored.columns},
            ),
            Clause(ClauseKind.NOT_MATCHED_BY_SOURCE_UPDATE, f"t.{quote(CURRENT)}", closing),
        ),
    )


def multiset_merge(schema: TargetSchema) -> MergePlan:
    """Delete every copy of the rows marked ``REMOVE``; insert the other source rows."""
    same_row = " AND ".join(f"{_target(c.name)} <=> {_source(c.name)}" for c in schema.columns)
    return MergePlan(
        f"s.{REMOVE} AND {same_row}",
        (
            Clause(ClauseKind.MATCHED_DELETE, None),
            Clause(
                ClauseKind.NOT_MATCHED_INSERT,
                f"NOT s.{REMOVE}",
                {quote(c.name): _source(c.name) for c in schema.columns},
            ),
        ),
    )


def merge_sql(plan: MergePlan, target: str, source: str) -> str:
    """``plan`` as one ``MERGE INTO`` statement of the table ``target`` (alias ``t``)
    from the relation ``source`` (alias ``s``)."""
    parts = [f"MERGE INTO {target} AS t USING {source} AS s ON {plan.condition}"]
    for clause in plan.clauses:
        when = f" AND ({clause.condition})" if clause.condition else ""
        if clause.kind is ClauseKind.MATCHED_UPDATE:
            settings = ", ".join(f"{c} = {v}" for c, v in clause.assignments.items())
            parts.append(f"WHEN MATCHED{when} THEN UPDATE SET {settings}")
        elif clause.kind is ClauseKind.MATCHED_DELETE:
            parts.append(f"WHEN MATCHED{when} THEN DELETE")
        elif clause.kind is ClauseKind.NOT_MATCHED_BY_SOURCE_UPDATE:
            settings = ", ".join(f"{c} = {v}" for c, v in clause.assignments.items())
            parts.append(f"WHEN NOT MATCHED BY SOURCE{when} THEN UPDATE SET {settings}")
        else:
            columns = ", ".join(clause.assignments)
            values = ", ".join(clause.assignments.values())
            parts.append(f"WHEN NOT MATCHED{when} THEN INSERT ({columns}) VALUES ({values})")
    return "\n".join(parts)


def conflict_in(message: str) -> str | None:
    """The conflict kind a failed MERGE raised, if it was one of ours."""
    at = message.find(CONFLICT_MARK)
    if at < 0:
        return None
    rest = message[at + len(CONFLICT_MARK) :]
    for kind in ("insert_exists", "update_exists"):
        if rest.startswith(kind):
            return kind
    return None


def on_exists(insert_exists_stops: bool, update_exists_stops: bool) -> OnExists:
    if insert_exists_stops and update_exists_stops:
        return OnExists.ERROR
    if insert_exists_stops:
        return OnExists.ERROR_ON_INSERT
    if update_exists_stops:
        return OnExists.ERROR_ON_UPDATE
    return OnExists.APPLY_REMOTE
