"""Every pgoutput message type, produced by a real publisher and decoded.

Runs against each installed major (15 from Debian, 14, 16, 17 and 18 from
npm's embedded builds), and every protocol version each one offers.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest

from subscriber.replication.commands import Streaming, StreamOptions, proto_version_for
from subscriber.replication.messages import (
    BINARY,
    TEXT,
    UNCHANGED,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from tests.support.pgdatabase import PgDatabase
from tests.support.streaming import create_slot, read_stream

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE TABLE t1 (a int PRIMARY KEY, b text, m mood, d posint);
CREATE TABLE t2 (x int, y text);
ALTER TABLE t2 REPLICA IDENTITY FULL;
CREATE TABLE t3 (id serial PRIMARY KEY, t1_a int REFERENCES t1(a));
CREATE TABLE unpublished (v int);
CREATE PUBLICATION p FOR TABLE t1, t2, t3;
"""


def count(messages: Sequence[Message], kind: type) -> int:
    return sum(isinstance(m, kind) for m in messages)


@pytest.mark.parametrize("proto", [1, 2, 3, 4])
def test_every_offered_protocol_version_decodes(publisher_any: PgDatabase, proto: int) -> None:
    db = publisher_any
    offered = proto_version_for(int(db.fetchval("SHOW server_version_num")))
    if proto > offered:
        pytest.skip(f"PostgreSQL {db.major} offers protocol versions 1 to {offered}")
    db.execute(SCHEMA)
    create_slot(db, "s1")
    db.execute("INSERT INTO t1 VALUES (1, 'one', 'happy', 5)")
    db.execute("UPDATE t1 SET a = 2 WHERE a = 1")
    db.execute("DELETE FROM t1")

    def done(ms: Sequence[Message]) -> bool:
        return count(ms, Commit) == 3

    ms = read_stream(db, "s1", StreamOptions(("p",), proto_version=proto), done)
    changes = [m for m in ms if isinstance(m, Insert | Update | Delete)]
    assert [type(m) for m in changes] == [Insert, Update, Delete]
    insert, update, delete = changes
    assert isinstance(insert, Insert) and insert.new.values == (b"1", b"one", b"happy", b"5")
    assert isinstance(update, Update) and update.old is not None
    assert update.old.values[0] == b"1"
    assert isinstance(delete, Delete) and delete.old is not None
    assert delete.old.values[0] == b"2"
    # Protocol 2+ tags every change with its transaction only inside a streamed block.
    assert all(m.xid is None for m in changes)


def test_dml_truncate_types_origin_and_messages(publisher_any: PgDatabase) -> None:
    db = publisher_any
    db.execute(SCHEMA)
    create_slot(db, "s1")
    db.execute("INSERT INTO t1 VALUES (1, 'one', 'happy', 5), (2, 'two', 'sad', 6)")
    db.execute("UPDATE t1 SET b = 'uno' WHERE a = 1")  # no key change: no old image
    db.execute("UPDATE t1 SET a = 10 WHERE a = 2")  # key change: 'K' old image
    db.execute("DELETE FROM t1 WHERE a = 10")  # 'K'
    db.execute("INSERT INTO t2 VALUES (1, 'x'), (1, 'x')")
    db.execute("UPDATE t2 SET y = 'z' WHERE ctid = (SELECT min(ctid) FROM t2)")  # 'O'
    db.execute("DELETE FROM t2 WHERE y = 'z'")  # 'O'
    db.execute("SELECT pg_logical_emit_message(true, 'pfx', 'in txn')")
    db.execute("SELECT pg_logical_emit_message(false, 'pfx', 'outside')")
    db.execute("INSERT INTO t3 (t1_a) VALUES (1)")
    db.execute("TRUNCATE t1, t3 RESTART IDENTITY CASCADE")
    with db.connect() as conn:
        conn.execute("SELECT pg_replication_origin_create('upstream')")
        conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
        with conn.transaction():
            conn.execute("SELECT pg_replication_origin_xact_setup('0/ABCDEF', now())")
            conn.execute("INSERT INTO t1 VALUES (99, 'from origin', NULL, NULL)")
    db.execute("INSERT INTO unpublished VALUES (1)")  # an empty transaction for p
    db.execute("INSERT INTO t1 VALUES (100, 'last', NULL, NULL)")

    def done(ms: Sequence[Message]) -> bool:
        return any(isinstance(m, Insert) and m.new.values[0] == b"100" for m in ms) and isinstance(
            ms[-1], Commit
        )

    ms = read_stream(db, "s1", StreamOptions(("p",), messages=True), done)

    # Every transaction is Begin .. Commit with matching LSNs.
    begins = [m for m in ms if isinstance(m, Begin)]
    commits = [m for m in ms if isinstance(m, Commit)]
    assert len(begins) == len(commits) >= 12
    assert all(b.final_lsn == c.commit_lsn for b, c in zip(begins, commits, strict=True))
    assert [c.end_lsn for c in commits] == sorted(c.end_lsn for c in commits)

    relations = {m.name: m for m in ms if isinstance(m, Relation)}
    assert relations["t1"].replica_identity is ReplicaIdentity.DEFAULT
    assert [c.name for c in relations["t1"].key_columns] == ["a"]
    assert relations["t2"].replica_identity is ReplicaIdentity.FULL
    types = {m.oid: m for m in ms if isinstance(m, Type)}
    t1_cols = {c.name: c.type_oid for c in relations["t1"].columns}
    assert (types[t1_cols["m"]].namespace, types[t1_cols["m"]].name) == ("public", "mood")
    # A domain's Type message carries the domain's OID and its base type's name.
    assert (types[t1_cols["d"]].namespace, types[t1_cols["d"]].name) == ("pg_catalog", "int4")

    t1, t2 = relations["t1"].oid, relations["t2"].oid
    updates = [m for m in ms if isinstance(m, Update)]
    plain = [u for u in updates if u.relation_oid == t1 and u.old is None]
    keyed = [u for u in updates if u.relation_oid == t1 and u.old is not None]
    full = [u for u in updates if u.relation_oid == t2]
    assert plain and plain[0].new.values[1] == b"uno"
    assert keyed[0].old_is_key and keyed[0].old.values[0] == b"2"  # type: ignore[union-attr]
    assert keyed[0].old.kinds[1:] == b"nnn"  # type: ignore[union-attr]
    assert keyed[0].new.values[0] == b"10"
    assert not full[0].old_is_key and full[0].old.values == (b"1", b"x")  # type: ignore[union-attr]
    deletes = [m for m in ms if isinstance(m, Delete)]
    assert deletes[0].old_is_key and deletes[0].old.values[0] == b"10"
    assert not deletes[1].old_is_key and deletes[1].old.values == (b"1", b"z")

    truncate = next(m for m in ms if isinstance(m, Truncate))
    assert truncate.cascade and truncate.restart_identity
    assert set(truncate.relation_oids) == {t1, relations["t3"].oid}

    messages = [m for m in ms if isinstance(m, LogicalMessage)]
    assert [(m.transactional, m.prefix, m.content) for m in messages] == [
        (True, "pfx", b"in txn"),
        (False, "pfx", b"outside"),
    ]

    origin = next(m for m in ms if isinstance(m, Origin))
    assert origin.name == "upstream" and str(origin.origin_lsn) == "0/ABCDEF"


def test_streamed_transaction_with_subtransaction_abort(publisher_any: PgDatabase) -> None:
    db = publisher_any
    db.execute(SCHEMA)
    db.set_config("logical_decoding_work_mem", "64kB")
    create_slot(db, "s1")
    with db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO t2 SELECT g, repeat('k', 50) FROM generate_series(1, 3000) g")
        conn.execute("SAVEPOINT sp")
        conn.execute("INSERT INTO t2 SELECT g, 'aborted' FROM generate_series(1, 3000) g")
        conn.execute("ROLLBACK TO SAVEPOINT sp")
        conn.execute("INSERT INTO t2 SELECT g, 'after' FROM generate_series(1, 10) g")

    def done(ms: Sequence[Message]) -> bool:
        return bool(ms) and isinstance(ms[-1], StreamCommit)

    ms = read_stream(db, "s1", StreamOptions(("p",), streaming=Streaming.ON), done)
    starts = [m for m in ms if isinstance(m, StreamStart)]
    assert len(starts) >= 2 and starts[0].first_segment and not starts[1].first_segment
    assert count(ms, StreamStop) == len(starts)
    top = starts[0].xid
    aborts = [m for m in ms if isinstance(m, StreamAbort)]
    assert aborts and all(a.xid == top and a.subxid != top for a in aborts)
    aborted = {a.subxid for a in aborts}
    kept = [m for m in ms if isinstance(m, Insert) and m.xid not in aborted]
    assert len(kept) == 3010
    assert all(m.xid is not None for m in ms if isinstance(m, Insert))
    assert not any(m.new.values[1] == b"aborted" for m in kept)
    final = ms[-1]
    assert isinstance(final, StreamCommit) and final.xid == top


def test_two_phase_prepare_commit_and_rollback(publisher_any: PgDatabase) -> None:
    db = publisher_any
    if db.major < 15:
        pytest.skip("two-phase decoding over the protocol needs PostgreSQL 15 (protocol 3)")
    db.execute(SCHEMA)
    create_slot(db, "s1", two_phase=True)
    with db.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t1 VALUES (1, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'g1'")
        conn.execute("COMMIT PREPARED 'g1'")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t1 VALUES (2, 'rolled back')")
        conn.execute("PREPARE TRANSACTION 'g2'")
        conn.execute("ROLLBACK PREPARED 'g2'")

    def done(ms: Sequence[Message]) -> bool:
        return any(isinstance(m, RollbackPrepared) for m in ms)

    ms = read_stream(db, "s1", StreamOptions(("p",), two_phase=True), done)
    kinds = [type(m) for m in ms if not isinstance(m, Relation | Type)]
    assert kinds == [
        BeginPrepare,
        Insert,
        Prepare,
        CommitPrepared,
        BeginPrepare,
        Insert,
        Prepare,
        RollbackPrepared,
    ]
    first = next(m for m in ms if isinstance(m, Prepare))
    committed = next(m for m in ms if isinstance(m, CommitPrepared))
    rolled = next(m for m in ms if isinstance(m, RollbackPrepared))
    assert first.gid == committed.gid == "g1" and rolled.gid == "g2"
    assert committed.xid == first.xid


def test_binary_mode_sends_binary_values(publisher_any: PgDatabase) -> None:
    db = publisher_any
    db.execute(SCHEMA)
    create_slot(db, "s1")
    db.execute("INSERT INTO t1 VALUES (7, 'seven', 'sad', 3)")

    def done(ms: Sequence[Message]) -> bool:
        return any(isinstance(m, Commit) for m in ms)

    ms = read_stream(db, "s1", StreamOptions(("p",), binary=True), done)
    insert = next(m for m in ms if isinstance(m, Insert))
    assert insert.new.kinds[0] == BINARY
    assert struct.unpack("!i", insert.new.values[0] or b"") == (7,)
    assert insert.new.values[1] == b"seven"


def test_unchanged_toast_value_is_marked(publisher: PgDatabase) -> None:
    db = publisher
    db.execute(SCHEMA)
    db.execute("ALTER TABLE t1 ALTER COLUMN b SET STORAGE EXTERNAL")
    db.execute(
        "INSERT INTO t1 SELECT 1, string_agg(md5(g::text), '') FROM generate_series(1, 400) g"
    )
    create_slot(db, "s1")
    db.execute("UPDATE t1 SET d = 4 WHERE a = 1")

    def done(ms: Sequence[Message]) -> bool:
        return any(isinstance(m, Commit) for m in ms)

    ms = read_stream(db, "s1", StreamOptions(("p",)), done)
    update = next(m for m in ms if isinstance(m, Update))
    assert update.new.kinds[1] == UNCHANGED and update.new.values[1] is None
    assert update.new.kinds[0] == TEXT
