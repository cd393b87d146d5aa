"""Logical decoding messages (``messages: true``) land in a Delta table, in commit order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication

pytestmark = pytest.mark.integration


def messages(warehouse: Path) -> list[dict[str, Any]]:
    """The messages table, read by delta-rs (it is a plain Delta table)."""
    import deltalake

    rows = deltalake.DeltaTable(str(warehouse / "_pgsub" / "messages")).to_pyarrow_table()
    return sorted(rows.to_pylist(), key=lambda row: row["lsn"])


def test_messages_land_in_commit_order_with_their_transaction_and_once(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE bag (a int);"
        "ALTER TABLE bag REPLICA IDENTITY FULL; CREATE PUBLICATION pub FOR TABLE t, bag"
    )
    settings: dict[str, Any] = {
        "messages": True,
        "batch": {"max_changes": 300, "max_delay": "200ms"},
    }
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute(
            "BEGIN; INSERT INTO t VALUES (1, 'a');"
            "SELECT pg_logical_emit_message(true, 'app', 'in the transaction');"
            "INSERT INTO t VALUES (2, 'b'); COMMIT"
        )
        xid_row = publisher.fetchval("SELECT xmin::text::bigint FROM t WHERE id = 1")
        publisher.execute("SELECT pg_logical_emit_message(false, 'audit', '\\xfffe'::bytea)")
        publisher.execute(
            "BEGIN; SELECT pg_logical_emit_message(true, 'app', 'rolled back'); ROLLBACK"
        )
        publisher.execute(  # larger than a batch: applied in pieces, a message in each
            "BEGIN;"
            "INSERT INTO bag SELECT g FROM generate_series(1, 500) g;"
            "SELECT pg_logical_emit_message(true, 'big', 'middle');"
            "INSERT INTO bag SELECT g FROM generate_series(501, 1000) g;"
            "SELECT pg_logical_emit_message(true, 'big', 'end');"
            "COMMIT"
        )
        rep.caught_up()
        rep.assert_equal("public.t", key=("id",))
        rep.assert_equal("public.bag")
        found = messages(warehouse)
        assert [(m["prefix"], m["transactional"], m["content_text"]) for m in found] == [
            ("app", True, "in the transaction"),
            ("audit", False, None),  # not UTF-8: its bytes are in content
            ("big", True, "middle"),
            ("big", True, "end"),
        ]
        assert found[0]["xid"] == xid_row and found[1]["content"] == b"\xff\xfe"
        assert found[1]["xid"] is None
    # Restarted: it goes on from where it was (a resent batch is dropped by the messages
    # table's own mark: tests/unit/apply/worker/test_applier.py).
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("SELECT pg_logical_emit_message(true, 'app', 'after')")
        rep.caught_up()
    assert [m["content_text"] for m in messages(warehouse)][-2:] == ["end", "after"]
    assert len(messages(warehouse)) == 5
