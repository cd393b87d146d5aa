"""Large transactions: streamed (``streaming: on``) and spilled, applied in pieces from disk."""

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from apply.arrival.spool_layout import SpoolLayout
from apply.delta.writer import local_merge
from tests.support.pgcluster import wait_until
from tests.support.pgdatabase import PgDatabase
from tests.support.replicate import Replication
from tests.support.writer import Writer

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE keyed (id int PRIMARY KEY, v text, n int);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE keyed, bag;
"""


def streamed_txns(publisher: PgDatabase, slot: str = "sub1") -> int:
    value = publisher.fetchval(
        "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", [slot]
    )
    return int(value or 0)


def commits(spark: Any, path: str) -> list[dict[str, Any]]:
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    return [json.loads(r["userMetadata"])["pgsub"] for r in history if r["userMetadata"]]


def test_streamed_transactions_apply_at_commit_without_aborted_parts(
    publisher_any: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """streaming: on, or parallel where the server has it (16+: Stream Abort carries its LSN)."""
    publisher = publisher_any
    publisher.execute(SCHEMA)
    publisher.set_config("logical_decoding_work_mem", "64kB")
    streaming = "parallel" if publisher.major >= 16 else "on"
    settings: dict[str, Any] = {
        "streaming": streaming,
        "batch": {"max_changes": 700, "max_delay": "300ms"},
    }
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed VALUES (0, 'before', 0)")
        rep.caught_up()
        with publisher.connect() as big, publisher.connect() as other:
            big.execute("BEGIN")
            big.execute("INSERT INTO keyed SELECT g, 'v' || g, 0 FROM generate_series(1, 3000) g")
            big.execute("SAVEPOINT a")
            big.execute("UPDATE keyed SET v = 'rolled back', n = -1 WHERE id <= 1500")
            big.execute("SAVEPOINT b")
            big.execute("INSERT INTO bag SELECT g % 7, 'undone' FROM generate_series(1, 900) g")
            big.execute("ROLLBACK TO SAVEPOINT a")  # both a and b go
            big.execute("INSERT INTO bag SELECT g % 7, 'kept' FROM generate_series(1, 1200) g")
            big.execute("SAVEPOINT c")
            big.execute("DELETE FROM keyed WHERE id % 10 = 0 AND id > 0")
            big.execute("RELEASE SAVEPOINT c")
            # A second streamed transaction, interleaved, that aborts as a whole.
            other.execute("BEGIN")
            other.execute("INSERT INTO bag SELECT g, 'aborted' FROM generate_series(1, 2000) g")
            # A small transaction commits while both are open.
            publisher.execute("UPDATE keyed SET v = 'small' WHERE id = 0")
            wait_until(lambda: streamed_txns(publisher) >= 2, timeout=60, what="two streamed")
            wait_until(
                lambda: [r["v"] for r in rep.rows("public.keyed")] == ["small"],
                timeout=60,
                what="the small transaction applied, nothing of the open ones",
            )
            assert rep.metrics.spill_bytes.labels("sub1")._value.get() > 0
            other.execute("ROLLBACK")
            big.execute("UPDATE keyed SET n = n + 1 WHERE id % 3 = 0")
            big.execute("COMMIT")
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
        rep.assert_equal("public.bag")
        assert rep.metrics.spill_bytes.labels("sub1")._value.get() == 0
    # Applied in pieces of 700 changes: the commits before the last say how far they got.
    marks = commits(spark, rep.path("public.keyed"))
    assert any("within" in m for m in marks), marks
    assert not list(rep.config.spool_path(str(rep.warehouse)).glob("*/stream-*"))


def test_a_transaction_larger_than_a_batch_is_spilled_and_applied_in_pieces(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    publisher.execute(SCHEMA)
    settings: dict[str, Any] = {"batch": {"max_changes": 500, "max_delay": "300ms"}}
    with Replication(publisher, spark, warehouse, **settings) as rep:

        def small_one(conn: psycopg.Connection[Any], n: int) -> None:
            conn.execute("INSERT INTO bag VALUES (%s, 'small')", [n])

        with Writer(publisher, small_one) as writer:
            publisher.execute(
                "BEGIN;"
                "INSERT INTO keyed SELECT g, 'v', 0 FROM generate_series(1, 2600) g;"
                "UPDATE keyed SET id = id + 10000 WHERE id % 100 = 0;"  # key changes
                "UPDATE keyed SET n = 1 WHERE id > 10000;"
                "INSERT INTO bag SELECT 1, 'big' FROM generate_series(1, 400) g;"
                "COMMIT"
            )
            writer.stop()
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
        rep.assert_equal("public.bag")
    marks = commits(spark, rep.path("public.keyed"))
    throughs = sorted(m["within"]["through"] for m in marks if "within" in m)
    assert throughs == [500, 1000, 1500, 2000, 2500, 3000], marks


def test_skip_of_a_transaction_applied_in_pieces_keeps_its_first_pieces_and_says_so(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """A Delta commit is final: the pieces before the failing one stay, and the skip says so.

    (A transaction that also changes a table without a key is applied in pieces; one that
    changes keyed tables only lands in one commit, and then nothing of it stays: see
    ``test_a_conflict_in_a_staged_transaction_commits_nothing_and_names_it``.)"""
    publisher.execute(SCHEMA)
    settings: dict[str, Any] = {"batch": {"max_changes": 4, "max_delay": "300ms"}}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed VALUES (0, 'first', 0)")
        rep.caught_up()
        spark.createDataFrame([(6, "local", 0)], "id int, v string, n int").write.format(
            "delta"
        ).mode("append").save(rep.path("public.keyed"))
        publisher.execute(  # 10 inserts in pieces of 4: the second piece meets the local 6
            "BEGIN; INSERT INTO keyed SELECT g, 'remote', 0 FROM generate_series(1, 10) g;"
            "INSERT INTO bag VALUES (1, 'b'); COMMIT"
        )
        publisher.execute("INSERT INTO keyed VALUES (11, 'after', 0)")
        with capture_logs() as logs:
            rep.skip(rep.failed_at())
            rep.caught_up()
        assert sorted((r["id"], r["v"]) for r in rep.rows("public.keyed")) == [
            (0, "first"),
            (1, "remote"),
            (2, "remote"),
            (3, "remote"),
            (4, "remote"),
            (6, "local"),
            (11, "after"),
        ]
        partly = "skipped transaction was partly applied before"
        (warning,) = [e for e in logs if e["event"] == partly]
        assert warning["table"] == "public.keyed" and warning["applied_through"] == 4


def test_wide_rows_are_bounded_by_bytes_not_by_their_count(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """200 rows of 32,000 bytes and ``max_bytes: 1MB``: spilled, and applied 33 rows a piece
    (the first 33 pass 1 MiB), however high ``max_changes`` is. (A table without a key: its
    transaction is applied in pieces, whose marks show where they were cut.)"""
    publisher.execute(SCHEMA)
    settings: dict[str, Any] = {
        "batch": {"max_changes": 100_000, "max_bytes": "1MB", "max_delay": "300ms"}
    }
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute(
            "INSERT INTO bag SELECT g, repeat(md5(g::text), 1000) FROM generate_series(1, 200) g"
        )
        rep.caught_up()
        rep.assert_equal("public.bag")
    marks = commits(spark, rep.path("public.bag"))
    throughs = sorted(m["within"]["through"] for m in marks if "within" in m)
    assert throughs == [33, 66, 99, 132, 165, 198], marks


def every_change(added: int, others: int) -> str:
    """One transaction over keyed's 3,000 rows: updates, deletes, ``added`` inserts; and
    ``others`` inserts into other."""
    return (
        "BEGIN;"
        "UPDATE keyed SET v = 'new', n = id WHERE id % 2 = 0;"
        "DELETE FROM keyed WHERE id % 5 = 0 AND id % 2 = 1;"
        f"INSERT INTO keyed SELECT g, 'added', 1 FROM generate_series(3001, {3000 + added}) g;"
        f"INSERT INTO other SELECT g, 'o' FROM generate_series(1, {others}) g;"
        "COMMIT"
    )


def merges(spark: Any, path: str) -> list[str]:
    """The operations of the table's commits, oldest first."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    return [r["operation"] for r in history]


@pytest.mark.parametrize("merged_by", ["delta-rs", "spark"])
def test_a_transaction_larger_than_a_batch_lands_in_one_commit_per_table(
    publisher: PgDatabase, spark: Any, warehouse: Path, monkeypatch: Any, merged_by: str
) -> None:
    """Pieces of 500 changes, staged: one commit per table for the whole transaction, so a
    reader never sees part of it, and the table is rewritten once, not once a piece. Staged
    pieces past ``STAGED_MAX_BYTES`` are Spark's MERGE (here: all of them, for "spark");
    inserts into the empty table are appended by delta-rs, for "delta-rs"."""
    if merged_by == "spark":  # neither merged nor appended by delta-rs
        monkeypatch.setattr(local_merge, "STAGED_MAX_BYTES", 0)
        monkeypatch.setattr(local_merge.LocalMerges, "append_staged", lambda *_: None)
    publisher.execute(SCHEMA + "CREATE TABLE other (id int PRIMARY KEY, v text);")
    publisher.execute("ALTER PUBLICATION pub ADD TABLE other")
    settings: dict[str, Any] = {"batch": {"max_changes": 500, "max_delay": "300ms"}}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed SELECT g, 'old', 0 FROM generate_series(1, 3000) g")
        rep.caught_up()
        before = len(merges(spark, rep.path("public.keyed")))
        publisher.execute(every_change(added=1000, others=900))
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
        rep.assert_equal("public.other", key=("id",))
        # One commit: a MERGE, or (a table this small) pgsub's rewrite of it, both by
        # delta-rs on a local warehouse (apply.delta.writer.local_merge).
        ones = (["MERGE"],) if merged_by == "spark" else (["MERGE"], ["WRITE"])
        assert merges(spark, rep.path("public.keyed"))[before:] in ones
        written = merges(spark, rep.path("public.other"))
        assert [op for op in written if not op.startswith("CREATE")] in ones
        if merged_by == "delta-rs":
            assert written[-1] == "WRITE"  # appended: every row an insert into no file
        assert not [m for m in commits(spark, rep.path("public.keyed")) if "within" in m]
        assert not list(
            SpoolLayout(rep.config.spool_path(str(rep.warehouse))).staging.glob("*/*")
        )  # cleaned after


def test_keys_changed_in_two_pieces_are_applied_in_pieces(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """A key with changes in two pieces: one MERGE of the staged pieces would hold it twice,
    so the transaction is applied piece by piece, as before. (A piece is whole frames of the
    spool, and a run of up to 8,192 changes is one frame: the update comes after more.)"""
    publisher.execute(SCHEMA)
    settings: dict[str, Any] = {"batch": {"max_changes": 500, "max_delay": "300ms"}}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute(
            "BEGIN;"
            "INSERT INTO keyed SELECT g, 'v', 0 FROM generate_series(1, 10000) g;"
            "UPDATE keyed SET v = 'again' WHERE id = 1;"
            "COMMIT"
        )
        rep.caught_up()
        rep.assert_equal("public.keyed", key=("id",))
    throughs = [
        m["within"]["through"] for m in commits(spark, rep.path("public.keyed")) if "within" in m
    ]
    assert sorted(throughs) == list(range(500, 10001, 500))


def test_a_conflict_in_a_staged_transaction_commits_nothing_and_names_it(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """insert_exists in the one MERGE of a large transaction: nothing of it is committed (no
    piece before the conflict stays), the error names the transaction, skip gets past it;
    delete_missing in another one is reported and skipped."""
    from structlog.testing import capture_logs

    publisher.execute(SCHEMA)
    settings: dict[str, Any] = {"batch": {"max_changes": 500, "max_delay": "300ms"}}
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed VALUES (0, 'first', 0)")
        rep.caught_up()
        spark.createDataFrame([(1500, "local", 0)], "id int, v string, n int").write.format(
            "delta"
        ).mode("append").save(rep.path("public.keyed"))
        publisher.execute("INSERT INTO keyed SELECT g, 'remote', 0 FROM generate_series(1, 2000) g")
        failed = rep.failed_at()
        assert 'relation "public.keyed"' in (rep.runner.status.last_error or "")  # type: ignore[union-attr]
        assert "insert_exists" in (rep.runner.status.last_error or "")  # type: ignore[union-attr]
        assert sorted(r["id"] for r in rep.rows("public.keyed")) == [0, 1500]  # all or nothing
        with capture_logs() as logs:
            rep.skip(failed)
            publisher.execute("DELETE FROM keyed WHERE id = 0")
            rep.caught_up()
            spark.sql(f"DELETE FROM delta.`{rep.path('public.keyed')}` WHERE id = 1500")
            publisher.execute(
                "INSERT INTO keyed SELECT g, 'v', 0 FROM generate_series(2001, 3200) g"
            )
            rep.caught_up()
            spark.sql(f"DELETE FROM delta.`{rep.path('public.keyed')}` WHERE id = 2500")
            publisher.execute("DELETE FROM keyed WHERE id > 2000")
            rep.caught_up()
        missing = [e for e in logs if e.get("event", "").startswith("conflict detected")]
        assert [e.get("conflict") or e["event"] for e in missing] and any(
            "delete_missing" in str(e) for e in missing
        ), missing
        assert rep.rows("public.keyed") == []


def test_a_streamed_transaction_is_staged_while_it_arrives(
    publisher: PgDatabase, spark: Any, warehouse: Path
) -> None:
    """streaming: on. A transaction's pieces are netted and staged as its blocks arrive, so
    that its commit finds them staged and only the MERGE is left; one commit per table.
    One with a subtransaction rolled back, and one that aborts, leave nothing behind."""
    publisher.execute(SCHEMA + "CREATE TABLE other (id int PRIMARY KEY, v text);")
    publisher.execute("ALTER PUBLICATION pub ADD TABLE other")
    publisher.set_config("logical_decoding_work_mem", "64kB")
    settings: dict[str, Any] = {
        "streaming": "on",
        "batch": {"max_changes": 500, "max_delay": "300ms"},
    }
    with Replication(publisher, spark, warehouse, **settings) as rep:
        publisher.execute("INSERT INTO keyed SELECT g, 'old', 0 FROM generate_series(1, 3000) g")
        rep.caught_up()
        before = len(merges(spark, rep.path("public.keyed")))
        with capture_logs() as logs:
            publisher.execute(every_change(added=3000, others=2000))
            rep.caught_up()
            rep.assert_equal("public.keyed", key=("id",))
            rep.assert_equal("public.other", key=("id",))
            staged = [e for e in logs if e.get("event") == "transaction staged"]
            assert [(e["while_arriving"], e["tables"]) for e in staged] == [(True, 2)], staged
            assert merges(spark, rep.path("public.keyed"))[before:] in (["MERGE"], ["WRITE"])
            assert not [m for m in commits(spark, rep.path("public.keyed")) if "within" in m]
            assert streamed_txns(publisher) >= 1

            with publisher.connect() as conn:
                conn.execute("BEGIN")
                conn.execute("UPDATE keyed SET v = 'kept' WHERE id <= 2000")
                conn.execute("SAVEPOINT a")
                conn.execute("UPDATE other SET v = 'rolled back' WHERE id <= 1500")
                conn.execute("ROLLBACK TO SAVEPOINT a")
                conn.execute(
                    "INSERT INTO other SELECT g, 'later' FROM generate_series(2001, 3000) g"
                )
                conn.execute("COMMIT")
            with publisher.connect() as conn:
                conn.execute("BEGIN")
                conn.execute("UPDATE keyed SET v = 'aborted' WHERE id > 2000")
                wait_until(lambda: streamed_txns(publisher) >= 3, timeout=60, what="streamed")
                conn.execute("ROLLBACK")
            rep.caught_up()
            rep.assert_equal("public.keyed", key=("id",))
            rep.assert_equal("public.other", key=("id",))
        # The second: staged while it arrived, or at its commit when its changes ran across
        # subtransactions or the rollback cut frames of its spool (apply.arrival.prestage; unit
        # tests); the third aborted. Both tables equal either way.
        staged = [e for e in logs if e.get("event") == "transaction staged"]
        assert [e["while_arriving"] for e in staged][:1] == [True] and len(staged) == 2, staged
        staging = SpoolLayout(rep.config.spool_path(str(rep.warehouse))).staging
        assert not [p for p in staging.rglob("*") if p.is_file()]  # nothing left behind
