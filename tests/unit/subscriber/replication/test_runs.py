"""Row changes decoded a run at a time equal them decoded one by one, errors included."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from subscriber.replication.errors import ProtocolError
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Commit, Delete, Insert, Message, Update
from subscriber.replication.pgoutput import WALK_AT_LEAST, PgOutputDecoder
from subscriber.replication.progress import Progress
from subscriber.replication.receiver import TransactionTracker
from subscriber.replication.runs import WHOLE_AT_MOST, Decoded, RunDecoder, WholeTransaction
from subscriber.replication.tuples import RowChanges
from tests.support import pgoutput_builder as b
from tests.support.streaming import as_messages

# (oid, column count) of the relations the runs change.
RELATIONS = {16384: 3, 16390: 2, 4_000_000_000: 4}


def session(proto: int = 2) -> PgOutputDecoder:
    decoder = PgOutputDecoder(proto)
    for oid, columns in RELATIONS.items():
        names = [(f"c{i}", 25, i == 0) for i in range(columns)]
        decoder.decode(b.relation(oid, "public", f"t{oid}", names))
    decoder.decode(b.begin(0x5000, 700))
    return decoder


def value(rng: random.Random) -> b.Value:
    pick = rng.random()
    if pick < 0.1:
        return None
    if pick < 0.15:
        return "u"
    if pick < 0.2:
        return bytearray(rng.randbytes(rng.randint(0, 9)))
    if pick < 0.25:
        return b""
    return str(rng.randint(0, 10 ** rng.randint(1, 12))).encode()


def change(rng: random.Random, oid: int, xid: int | None = None) -> bytes:
    columns = RELATIONS[oid]

    def image() -> list[b.Value]:
        return [value(rng) for _ in range(columns)]

    kind = rng.randrange(6)
    if kind == 0:
        return b.insert(oid, image(), xid)
    if kind == 1:
        return b.update(oid, image(), xid=xid)
    if kind == 2:
        return b.update(oid, image(), image(), key=True, xid=xid)
    if kind == 3:
        return b.update(oid, image(), image(), key=False, xid=xid)
    return b.delete(oid, image(), key=kind == 4, xid=xid)


def run_of(rng: random.Random, counts: dict[int, int], xid: int | None = None) -> list[bytes]:
    oids = [oid for oid, count in counts.items() for _ in range(count)]
    rng.shuffle(oids)
    return [change(rng, oid, xid) for oid in oids]


def lsns(payloads: Sequence[bytes]) -> list[Lsn]:
    return [Lsn(0x6000 + 0x40 * i) for i in range(len(payloads))]


def one_by_one(decoder: PgOutputDecoder, payloads: Sequence[bytes]) -> list[object]:
    return [decoder.decode(p, lsn) for p, lsn in zip(payloads, lsns(payloads), strict=True)]


def mutate(payloads: list[bytes], mutations: Sequence[tuple[int, int, int]]) -> None:
    """Each mutation (which message, where, byte) sets that byte, or cuts the message
    there when the byte is negative."""
    for which, where, byte in mutations:
        index = which % len(payloads)
        payload = bytearray(payloads[index])
        if not payload:
            continue
        at = where % len(payload)
        if byte < 0:
            del payload[at:]
        else:
            payload[at] = byte
        payloads[index] = bytes(payload)


def outcome(decode: object) -> object:
    try:
        return decode() if callable(decode) else decode
    except ProtocolError as exc:
        return str(exc)


def test_a_mixed_run_decodes_as_one_by_one_and_is_walked() -> None:
    rng = random.Random(7)
    # Two relations with enough changes to be walked, one with a few left over.
    payloads = run_of(rng, {16384: 300, 16390: 120, 4_000_000_000: 5})
    decoder = session()
    changes = decoder.decode_changes(payloads, lsns(payloads))
    assert changes.messages() == one_by_one(decoder, payloads)
    walked = {g.relation_oid for g in changes.groups if g.walked is not None}
    assert walked == {16384, 16390}
    for group in changes.groups:
        if group.walked is not None:
            for column in (*group.walked.new.values, *group.walked.old.values):
                column.validate(full=True)
    assert {type(m) for m in changes.messages()} == {Insert, Update, Delete}


def test_values_of_every_kind_come_out_as_sent() -> None:
    payloads = [
        b.insert(16390, [b"1", None]),
        b.insert(16390, [bytearray(b"\x00\x01"), "u"]),
        b.insert(16390, [b"", b"x" * 70_000]),
    ] * WALK_AT_LEAST
    payloads.append(b.insert(16390, [b"2", None]))  # a NULL in the run's very last byte
    decoder = session()
    changes = decoder.decode_changes(payloads, lsns(payloads))
    assert changes.groups[0].walked is not None
    images = [m.new for m in changes.messages() if isinstance(m, Insert)]
    assert [(i.kinds, i.values) for i in images[:3]] == [
        (b"tn", (b"1", None)),
        (b"bu", (b"\x00\x01", None)),
        (b"tt", (b"", b"x" * 70_000)),
    ]
    assert (images[-1].kinds, images[-1].values) == (b"tn", (b"2", None))
    for column in changes.groups[0].walked.new.values:
        column.validate(full=True)


def test_a_streamed_run_keeps_each_message_xid() -> None:
    rng = random.Random(3)
    decoder = session(proto=2)
    decoder.decode(b.commit(0x5000, 0x5008))
    decoder.decode(b.stream_start(42))
    payloads = [change(rng, 16384, rng.choice([42, 43, 44])) for _ in range(100)]
    changes = decoder.decode_changes(payloads, lsns(payloads))
    expected = one_by_one(decoder, payloads)
    assert changes.messages() == expected
    assert changes.xids == tuple(m.xid for m in expected)  # type: ignore[attr-defined]
    assert changes.groups[0].walked is not None


def corrupt(payload: bytes, how: str) -> bytes:
    if how == "truncated":
        return payload[:-2]
    if how == "trailing":
        return payload + b"\x00"
    if how == "kind":
        return payload.replace(b"t\x00\x00\x00", b"q\x00\x00\x00", 1)
    if how == "length":
        return payload.replace(b"t\x00\x00\x00", b"t\x7f\x00\x00", 1)
    if how == "negative length":
        return payload.replace(b"t\x00\x00\x00", b"t\xff\xff\xff", 1)
    if how == "columns":
        return payload[:6] + b"\x00\x07" + payload[8:]
    if how == "unknown relation":
        return payload[:1] + b"\x00\x00\x00\x99" + payload[5:]
    if how == "part":
        return payload[:5] + b"Z" + payload[6:]
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "truncated",
        "trailing",
        "kind",
        "length",
        "negative length",
        "columns",
        "unknown relation",
        "part",
    ],
)
def test_a_bad_message_raises_what_one_by_one_raises(how: str) -> None:
    payloads = [b.insert(16384, [str(i).encode(), b"a", b"b"]) for i in range(100)]
    payloads[57] = corrupt(payloads[57], how)
    decoder = session()
    expected = outcome(lambda: one_by_one(decoder, payloads))
    assert isinstance(expected, str) and "LSN 0/6E40" in expected  # message 57's own LSN
    assert outcome(lambda: decoder.decode_changes(payloads, lsns(payloads))) == expected


def test_changes_outside_a_transaction_are_refused_as_one_by_one() -> None:
    decoder = session()
    decoder.decode(b.commit(0x5000, 0x5008))
    payloads = [b.insert(16390, [b"1", b"2"])] * 50
    with pytest.raises(ProtocolError, match="change outside a transaction"):
        decoder.decode_changes(payloads, lsns(payloads))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    counts=st.tuples(st.integers(0, 80), st.integers(0, 80), st.integers(0, 40)),
    mutations=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(-1, 255)),
        max_size=3,
    ),
)
def test_any_run_decodes_as_one_by_one(
    seed: int, counts: tuple[int, int, int], mutations: list[tuple[int, int, int]]
) -> None:
    """Random runs, some with bytes changed or cut: the same messages or the same error."""
    rng = random.Random(seed)
    payloads = run_of(rng, dict(zip(RELATIONS, counts, strict=True)))
    if not payloads:
        return
    mutate(payloads, mutations)
    decoder = session()
    expected = outcome(lambda: one_by_one(decoder, payloads))
    got = outcome(lambda: decoder.decode_changes(payloads, lsns(payloads)).messages())
    assert got == expected


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    where=st.sampled_from(["transaction", "streamed block", "outside"]),
    mutation=st.one_of(
        st.none(),
        st.tuples(st.integers(0, 10**6), st.integers(-1, 255)),
        st.sampled_from(
            ["truncated", "trailing", "kind", "length", "negative length", "columns",
             "unknown relation", "part"]
        ),
    ),
)  # fmt: skip
def test_a_change_read_without_a_cursor_is_what_decode_reads(
    seed: int, where: str, mutation: tuple[int, int] | str | None
) -> None:
    """``decode_change`` (no cursor, for a backlog of small transactions) returns the
    message ``decode`` returns, or raises its error: any row change, well formed or with a
    byte changed or cut, in a transaction, a streamed block or neither."""
    rng = random.Random(seed)
    xid = 42 if where == "streamed block" else None
    payload = change(rng, rng.choice(list(RELATIONS)), xid)
    if isinstance(mutation, str):
        payload = corrupt(payload, mutation)
    elif mutation is not None:
        payloads = [payload]
        mutate(payloads, [(0, *mutation)])
        payload = payloads[0]

    def decoder() -> PgOutputDecoder:
        made = session()
        if where != "transaction":
            made.decode(b.commit(0x5000, 0x5008))
        if where == "streamed block":
            made.decode(b.stream_start(42))
        return made

    lsn = Lsn(0x7000)
    expected = outcome(lambda: decoder().decode(payload, lsn))
    assert outcome(lambda: decoder().decode_change(payload, lsn)) == expected


def test_run_decoder_hands_on_in_stream_order() -> None:
    decoder = session()
    runs = RunDecoder(decoder, max_messages=40)
    payloads = [b.insert(16390, [str(i).encode(), b"x"]) for i in range(100)]
    out: list[object] = []
    for payload, lsn in zip(payloads, lsns(payloads), strict=True):
        out.extend(runs.push(payload, lsn))
    assert runs.holding == 20
    out.extend(runs.push(b.commit(0x5000, 0x5008), Lsn(0x9000)))
    # Two full runs; the 20 left before the Commit are too few to walk.
    assert [type(m) for m in out] == [RowChanges, RowChanges] + [Insert] * 20 + [Commit]
    flat = [m for i in out for m in (i.messages() if isinstance(i, RowChanges) else [i])]
    assert flat == [*one_by_one(session(), payloads), Commit(0, Lsn(0x5000), Lsn(0x5008), 0)]


def test_run_decoder_bounds_a_run_by_bytes() -> None:
    runs = RunDecoder(session(), max_bytes=100_000)
    big = b.insert(16390, [b"1", b"x" * 30_000])
    released = [runs.push(big, Lsn(1)) for _ in range(4)]
    assert [len(r) for r in released] == [0, 0, 0, 4]
    assert runs.holding == 0


def transactions(rng: random.Random, count: int) -> tuple[list[bytes], int]:
    """Transactions of 0-12 changes, some with an Origin, a Relation or a logical
    message inside; and how many of them a run decoder may hand on whole."""
    origin = b.origin(0x77, "node")
    message = b"M" + struct.pack("!BQ", 1, 0x88) + b"app\0" + struct.pack("!i", 2) + b"hi"
    relation = b.relation(16390, "public", "t16390", [("c0", 25, True), ("c1", 25, False)])
    out: list[bytes] = []
    whole = 0
    for n in range(count):
        final = 0x10_000 + 0x100 * n
        body = run_of(rng, {16384: rng.randint(0, 6), 16390: rng.randint(0, 6)})
        inside = rng.choice([None, None, None, origin, message, relation])
        if inside is not None:
            body.insert(rng.randint(0, len(body)), inside)
        elif len(body) <= WHOLE_AT_MOST:
            whole += 1
        out += [b.begin(final, 700 + n, commit_time=n), *body]
        out.append(b.commit(final, final + 0x10, commit_time=n))
    return out, whole


# Random streams of transactions (a seed), with up to two bytes changed or cut.
random_streams = given(
    seed=st.integers(0, 2**32),
    mutations=st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(-1, 255)),
        max_size=2,
    ),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@random_streams
def test_small_transactions_handed_on_whole_are_the_messages_one_by_one(
    seed: int, mutations: list[tuple[int, int, int]]
) -> None:
    """Random streams of transactions, some bytes changed or cut: a run decoder that hands
    small transactions on whole hands on the same messages, or raises the same error, as
    decoding one by one; and each transaction it held was counted open once."""
    rng = random.Random(seed)
    payloads, whole = transactions(rng, 30)
    mutate(payloads, mutations)
    expected = outcome(lambda: one_by_one(session_outside(), payloads))
    held: list[int] = []
    runs = RunDecoder(session_outside(), max_messages=16, held=lambda: held.append(1))
    handed: list[Decoded] = []

    def decode_all() -> list[Message]:
        for payload, lsn in zip(payloads, lsns(payloads), strict=True):
            handed.extend(runs.push(payload, lsn))
        return as_messages(handed)

    assert outcome(decode_all) == expected
    if not mutations:
        assert sum(isinstance(d, WholeTransaction) for d in handed) == whole
        assert len(held) == 30  # every Begin was held; those not whole went on as messages


def session_outside() -> PgOutputDecoder:
    """A session that knows the relations, outside any transaction."""
    decoder = session()
    decoder.decode(b.commit(0x5000, 0x5008))
    return decoder


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@random_streams
def test_frames_pushed_as_each_read_brought_them_decode_as_one_by_one(
    seed: int, mutations: list[tuple[int, int, int]]
) -> None:
    """The same random streams, cut into the lots of frames reads bring (``push_all``, the
    receiver's way): the same messages or the same error as decoding one by one, each small
    transaction still handed on whole - read in one step when all of it is in one lot, its
    Begin held across lots otherwise - and, told to a tracker, every transaction counted
    open is closed: none is left open, whether it was held or read whole."""
    rng = random.Random(seed)
    payloads, whole = transactions(rng, 30)
    mutate(payloads, mutations)
    expected = outcome(lambda: one_by_one(session_outside(), payloads))
    progress = Progress(Lsn(1))
    tracker = TransactionTracker(progress)
    runs = RunDecoder(session_outside(), max_messages=16, held=tracker.held)
    frames = list(zip(lsns(payloads), payloads, strict=True))
    handed: list[Decoded] = []

    def decode_all() -> list[Message]:
        at = 0
        while at < len(frames):
            lot = frames[at : at + rng.randint(1, 12)]
            at += len(lot)
            for decoded in runs.push_all(lot):
                tracker.observe(decoded)
                handed.append(decoded)
        return as_messages(handed)

    assert outcome(decode_all) == expected
    if not mutations:
        assert sum(isinstance(d, WholeTransaction) for d in handed) == whole
        progress.confirm_flushed(Lsn(0x10_000 + 0x100 * 30))  # past every commit
        assert progress.idle  # none left open: each counted open once, closed once


def test_a_small_transaction_all_in_one_lot_is_read_whole_without_holding_its_begin() -> None:
    """``whole_at``'s way: a Begin, its row changes and its Commit in one lot come out as
    one ``WholeTransaction`` - equal to what ``push`` makes of them one at a time - with no
    Begin held; cut after its Begin, the same transaction is held until its Commit."""
    stream = [
        b.begin(0x7000, 701, commit_time=5),
        b.update(16384, [b"1", b"x", None]),
        b.insert(16390, [b"2", b"y"]),
        b.commit(0x7000, 0x7010, commit_time=5),
    ]
    frames = list(zip(lsns(stream), stream, strict=True))
    one_at_a_time = RunDecoder(session_outside(), held=lambda: None)
    expected = [d for lsn, payload in frames for d in one_at_a_time.push(payload, lsn)]
    held: list[int] = []
    runs = RunDecoder(session_outside(), held=lambda: held.append(1))
    assert list(runs.push_all(frames)) == expected
    assert isinstance(expected[0], WholeTransaction) and held == []
    assert list(runs.push_all(frames[:1])) == [] and held == [1]
    assert list(runs.push_all(frames[1:])) == expected
