"""Conflict judgement on a chain's first change, and PostgreSQL's wording."""

from datetime import UTC, datetime

import pytest

from conflicts.kinds import ConflictKind, First, Resolution, judge
from conflicts.report import Conflict, cut
from subscriber.replication.lsn import Lsn


@pytest.mark.parametrize(
    ("first", "found", "kind"),
    [
        (First.INSERT, True, ConflictKind.INSERT_EXISTS),
        (First.KEY_UPDATE_NEW, True, ConflictKind.UPDATE_EXISTS),
        (First.UPDATE, False, ConflictKind.UPDATE_MISSING),
        (First.KEY_UPDATE_OLD, False, ConflictKind.UPDATE_MISSING),
        (First.DELETE, False, ConflictKind.DELETE_MISSING),
        (First.INSERT, False, None),
        (First.UPDATE, True, None),
        (First.DELETE, True, None),
    ],
)
def test_a_chain_is_judged_on_its_first_change(
    first: First, found: bool, kind: ConflictKind | None
) -> None:
    assert judge(first, found) is kind


def conflict(kind: ConflictKind, **rows: dict[str, str | None] | None) -> Conflict:
    return Conflict(
        kind=kind,
        relation="public.t",
        resolution=Resolution.ERROR,
        key={"a": "1"},
        existing=rows.get("existing"),
        remote=rows.get("remote"),
        replica_identity=rows.get("identity"),
        xid=725,
        finish_lsn=Lsn.parse("0/14C0378"),
        commit_time=datetime(2026, 11, 22, tzinfo=UTC),
    )


def test_insert_exists_reads_like_postgresql() -> None:
    c = conflict(
        ConflictKind.INSERT_EXISTS,
        existing={"a": "1", "b": "local"},
        remote={"a": "1", "b": "remote"},
    )
    assert c.message == 'conflict detected on relation "public.t": conflict=insert_exists'
    assert c.detail == (
        "Key already exists in the Delta table. Key (a)=(1); existing local row (1, local);"
        " remote row (1, remote)."
    )
    fields = c.log_fields()
    assert fields["finish_lsn"] == "0/14C0378" and fields["remote_xid"] == 725


def test_missing_rows_name_the_replica_identity() -> None:
    c = conflict(ConflictKind.DELETE_MISSING, identity={"a": "1"})
    assert c.detail == "Could not find the row to be deleted. Replica identity (a)=(1)."


def test_values_are_cut_at_64_bytes() -> None:
    assert cut("x" * 64) == "x" * 64
    assert cut("x" * 65) == "x" * 64 + "..."
    assert cut("é" * 40) == "é" * 32 + "..."  # never half a character
    c = conflict(ConflictKind.UPDATE_MISSING, remote={"a": "1", "b": "y" * 100})
    assert c.log_fields()["remote_row"] == {"a": "1", "b": "y" * 64 + "..."}
