"""``apply.history.versions``: a batch's change rows as versions of each key, judged against the
keys' current versions as PostgreSQL's subscriber judges each change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from apply.columns.schema import TargetColumn, TargetSchema
from apply.columns.typemap import INT4, TEXT, ColumnType
from apply.history.changelog import COMMIT_TIME, LSN, OLD, OP, UNCHANGED_COLUMNS
from apply.history.versions import (
    CURRENT,
    VALID_FROM,
    VALID_FROM_TIME,
    VALID_TO,
    VALID_TO_TIME,
    touched_keys,
    versioned,
    versions_source,
)
from conflicts.kinds import DEFAULTS, ConflictKind, Resolution

SCHEMA = TargetSchema(
    "public.t",
    (
        TargetColumn("id", ColumnType(INT4)),
        TargetColumn("v", ColumnType(TEXT)),
        TargetColumn("big", ColumnType(TEXT)),
    ),
    ("id",),
)


def at(lsn: int) -> datetime:
    return datetime(2026, 11, 26, 0, 0, lsn, tzinfo=UTC)


def change(
    op: str, lsn: int, id_: int | None, v: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        OP: op,
        LSN: lsn,
        COMMIT_TIME: at(lsn),
        "id": id_,
        "v": v,
        "big": extra.get("big"),
        UNCHANGED_COLUMNS: extra.get("unchanged"),
        OLD + "id": extra.get("old"),
    }


def changes(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows))


def version(id_: int, v: str, lsn: int, big: str | None = None) -> dict[str, Any]:
    """A current version in the table (copied: no time)."""
    return {
        "id": id_,
        "v": v,
        "big": big,
        VALID_FROM: lsn,
        VALID_FROM_TIME: None,
        VALID_TO: None,
        VALID_TO_TIME: None,
        CURRENT: True,
    }


def opened(out: Any) -> list[tuple[Any, ...]]:
    return [(o["id"], o["v"], o[VALID_FROM], o[VALID_TO], o[CURRENT]) for o in out.opens]


def closed(out: Any) -> list[tuple[Any, ...]]:
    return [(c["id"], c[VALID_FROM], c[VALID_TO]) for c in out.closes]


def test_an_update_closes_the_version_and_opens_one_with_the_unchanged_toast_value() -> None:
    batch = changes(change("update", 20, 1, "uno", unchanged=["big"]))
    out = versioned(batch, SCHEMA, [version(1, "one", 10, big="x" * 9)], DEFAULTS)
    assert closed(out) == [(1, 10, 20)]
    assert out.closes[0][VALID_TO_TIME] == at(20)
    assert opened(out) == [(1, "uno", 20, None, True)]
    assert out.opens[0]["big"] == "x" * 9 and out.opens[0][VALID_FROM_TIME] == at(20)
    assert not out.conflicts


def test_each_transaction_is_a_version_and_one_transaction_leaves_one() -> None:
    batch = changes(
        change("insert", 20, 2, "a"),
        change("update", 20, 2, "b"),  # the same transaction: "a" was never seen
        change("update", 30, 2, "c"),
        change("delete", 40, 2),
    )
    out = versioned(batch, SCHEMA, [], DEFAULTS)
    assert out.closes == []
    assert opened(out) == [(2, "b", 20, 30, False), (2, "c", 30, 40, False)]


def test_a_key_change_closes_the_old_key_and_opens_the_new_one() -> None:
    batch = changes(change("update", 20, 5, "one", old=1))
    out = versioned(batch, SCHEMA, [version(1, "one", 10)], DEFAULTS)
    assert closed(out) == [(1, 10, 20)]
    assert opened(out) == [(5, "one", 20, None, True)]


def test_a_truncate_closes_what_the_batch_opened_and_marks_the_table_emptied() -> None:
    batch = changes(
        change("insert", 20, 3, "three"),
        change("truncate", 30, None),
        change("insert", 30, 1, "again"),  # after the TRUNCATE: no insert_exists
    )
    out = versioned(batch, SCHEMA, [version(1, "one", 10)], DEFAULTS)
    assert out.truncated == (30, at(30))
    assert out.closes == []  # the table's own versions close by the TRUNCATE's clause
    assert opened(out) == [(3, "three", 20, 30, False), (1, "again", 30, None, True)]
    assert not out.conflicts


def test_conflicts_are_judged_per_change_with_their_actions() -> None:
    batch = changes(
        change("update", 20, 7, "x"),  # update_missing: skipped
        change("delete", 20, 8),  # delete_missing: skipped
        change("insert", 30, 1, "dup"),  # insert_exists: stops by default
    )
    out = versioned(batch, SCHEMA, [version(1, "one", 10)], DEFAULTS)
    kinds = [(c.kind, c.change, c.action) for c in out.conflicts]
    assert kinds == [
        (ConflictKind.UPDATE_MISSING, 0, Resolution.SKIP),
        (ConflictKind.DELETE_MISSING, 1, Resolution.SKIP),
        (ConflictKind.INSERT_EXISTS, 2, Resolution.ERROR),
    ]
    assert out.stop is out.conflicts[2] and out.conflicts[2].existing is not None

    overwrite = dict(DEFAULTS) | {
        ConflictKind.INSERT_EXISTS: Resolution.APPLY_REMOTE,
        ConflictKind.UPDATE_MISSING: Resolution.APPLY_REMOTE,
    }
    out = versioned(batch, SCHEMA, [version(1, "one", 10)], overwrite)
    assert out.stop is None
    assert closed(out) == [(1, 10, 30)]
    assert opened(out) == [(7, "x", 20, None, True), (1, "dup", 30, None, True)]


def test_the_source_holds_the_closes_without_a_current_flag_then_the_versions() -> None:
    batch = changes(change("update", 20, 1, "uno"), change("insert", 20, 2, "two"))
    out = versioned(batch, SCHEMA, [version(1, "one", 10)], DEFAULTS)
    source = versions_source(out, SCHEMA).to_pylist()
    assert [(r["id"], r[VALID_FROM], r[VALID_TO], r[CURRENT]) for r in source] == [
        (1, 10, 20, None),
        (1, 20, None, True),
        (2, 20, None, True),
    ]
    assert touched_keys(changes(change("update", 20, 5, "v", old=1)), SCHEMA) == [(1,), (5,)]
