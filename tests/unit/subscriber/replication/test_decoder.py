"""Hand-built edge cases and fuzzing of the pgoutput decoder."""

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import (
    BINARY,
    NULL,
    TEXT,
    UNCHANGED,
    Begin,
    Commit,
    Insert,
    Relation,
    ReplicaIdentity,
)
from subscriber.replication.pgoutput import PgOutputDecoder
from tests.support import pgoutput_builder as b

REL = b.relation(16384, "public", "t1", [("a", 23, True), ("b", 25, False)])


def decoder_in_transaction(proto: int = 1) -> PgOutputDecoder:
    decoder = PgOutputDecoder(proto)
    decoder.decode(b.begin(0x1528540, 726))
    decoder.decode(REL)
    return decoder


def test_captured_example_from_protocol_md() -> None:
    decoder = PgOutputDecoder(2)
    assert decoder.decode(b.begin(0x1528540, 726)) == Begin(Lsn(0x1528540), 0, 726)
    relation = decoder.decode(REL)
    assert isinstance(relation, Relation)
    assert relation.qualified_name == "public.t1"
    assert relation.replica_identity is ReplicaIdentity.DEFAULT
    assert [c.name for c in relation.key_columns] == ["a"]
    insert = decoder.decode(b.insert(16384, [b"0", b"x"]))
    assert isinstance(insert, Insert)
    assert insert.new.kinds == bytes([TEXT, TEXT])
    assert insert.new.values == (b"0", b"x")
    assert decoder.decode(b.commit(0x1528540, 0x1528570)) == Commit(
        0, Lsn(0x1528540), Lsn(0x1528570), 0
    )


def test_null_and_unchanged_toast_columns() -> None:
    decoder = decoder_in_transaction()
    insert = decoder.decode(b.insert(16384, [None, "u"]))
    assert isinstance(insert, Insert)
    assert insert.new.kinds == bytes([NULL, UNCHANGED])
    assert insert.new.values == (None, None)


def test_binary_column_kind() -> None:
    decoder = decoder_in_transaction()
    payload = b"I" + struct.pack("!I", 16384) + b"N" + struct.pack("!h", 2)
    payload += b"b" + struct.pack("!i", 4) + struct.pack("!i", 7) + b"n"
    insert = decoder.decode(payload)
    assert isinstance(insert, Insert)
    assert insert.new.kinds == bytes([BINARY, NULL])
    assert insert.new.values == (struct.pack("!i", 7), None)


def test_relation_replaced_by_newer_definition() -> None:
    decoder = decoder_in_transaction()
    decoder.decode(
        b.relation(16384, "public", "t1", [("a", 23, True), ("b", 25, False), ("c", 20, False)])
    )
    assert len(decoder.relations[16384].columns) == 3
    with pytest.raises(ProtocolError, match="3"):
        decoder.decode(b.insert(16384, [b"1", b"2"]))


def test_pg_catalog_namespace_is_named() -> None:
    decoder = PgOutputDecoder(1)
    relation = decoder.decode(b.relation(1, "", "t", []))
    assert isinstance(relation, Relation)
    assert relation.namespace == "pg_catalog"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b.insert(16384, [b"1", b"2"])[:-1], "ends early|past the message end"),
        (b"Z", "unknown message type 0x5a"),
        (b.insert(99, [b"1"]), "relation OID 99"),
        (b.insert(16384, [b"1", b"2"]) + b"!", "unexpected bytes"),
        (
            b"I"
            + struct.pack("!I", 16384)
            + b"N"
            + struct.pack("!h", 2)
            + b"t"
            + struct.pack("!i", -5),
            "length -5",
        ),
        (b"I" + struct.pack("!I", 16384) + b"N" + struct.pack("!h", 2) + b"x", "kind 0x78"),
        (b"I" + struct.pack("!I", 16384) + b"Q", "expected 'N'"),
        (b.commit(0x999, 0x1000), "does not match its Begin"),
        (b.begin(1, 2), "still open"),
        (b.stream_start(5), "unknown message type"),  # protocol 1 has no streaming
    ],
)
def test_malformed_messages_raise_protocol_error(payload: bytes, reason: str) -> None:
    decoder = decoder_in_transaction()
    with pytest.raises(ProtocolError, match=reason) as info:
        decoder.decode(payload, Lsn(0x1528560))
    assert "LSN 0/1528560" in str(info.value)
    assert info.value.msg_type == chr(payload[0])


def test_change_outside_transaction_is_an_error() -> None:
    decoder = PgOutputDecoder(1)
    decoder.decode(REL)
    with pytest.raises(ProtocolError, match="outside a transaction"):
        decoder.decode(b.insert(16384, [b"1", b"2"]))


def test_commit_without_begin_is_an_error() -> None:
    with pytest.raises(ProtocolError, match="without a Begin"):
        PgOutputDecoder(1).decode(b.commit(1, 2))


def test_streamed_changes_carry_an_xid() -> None:
    decoder = PgOutputDecoder(2)
    decoder.decode(b.stream_start(42))
    decoder.decode(b.relation(16384, "public", "t1", [("a", 23, True)], xid=42))
    insert = decoder.decode(b.insert(16384, [b"1"], xid=42))
    assert isinstance(insert, Insert)
    assert insert.xid == 42


def _fresh(proto: int) -> PgOutputDecoder:
    decoder = PgOutputDecoder(proto)
    decoder.decode(b.begin(100, 1))
    decoder.decode(REL)
    return decoder


@settings(max_examples=3000, deadline=None)
@given(payload=st.binary(max_size=200), proto=st.integers(1, 4))
def test_arbitrary_bytes_decode_or_raise_protocol_error(payload: bytes, proto: int) -> None:
    with contextlib.suppress(ProtocolError):
        _fresh(proto).decode(payload)


SEEDS = [
    REL,
    b.insert(16384, [b"12", None]),
    b.commit(100, 120),
    b.stream_start(3),
    b.insert(16384, [b"u" * 40, "u"]),
]


@settings(max_examples=3000, deadline=None)
@given(seed=st.sampled_from(SEEDS), data=st.data(), proto=st.integers(1, 4))
def test_mutated_messages_decode_or_raise_protocol_error(
    seed: bytes, data: st.DataObject, proto: int
) -> None:
    payload = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(payload) - 1)))
        if action == "flip" and payload:
            payload[pos] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del payload[pos:]
        else:
            payload[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    with contextlib.suppress(ProtocolError):
        _fresh(proto).decode(bytes(payload))
