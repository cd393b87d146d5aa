"""The receiver's Python per transaction: a backlog of single-row transactions, no server.

A backlog of small transactions (``make bench-backlog``) is bound by the
receiver thread: each transaction is three CopyData frames (Begin, one row
change, Commit), and each frame is parsed, decoded, tracked and assembled
in Python before the transaction reaches the apply side. This times that
path alone - the frames made in memory as the walsender sends them, fed
through what the receiver thread runs for each (``wire.xlog_frames``, ``BURST``
frames at a time as ``ReplicationStream.read_all`` takes them from libpq; then
``RunDecoder``, ``TransactionTracker``, ``TransactionAssembler``) - so that
a change to it is measured in seconds, not in a benchmark of minutes.
PostgreSQL's own apply worker drains the same backlog at about 44,000
transactions/s on this machine (``make bench-backlog``).

    python -m benchmarks.receive_path --transactions 200000
"""

from __future__ import annotations

import argparse
import struct
import time

from apply.arrival.assembly import TransactionAssembler
from subscriber.replication.lsn import Lsn, unpacked
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.progress import Progress
from subscriber.replication.receiver import TransactionTracker
from subscriber.replication.runs import RunDecoder
from subscriber.replication.wire import GetCopyData, xlog_frames
from tests.support import pgoutput_builder as pg

OID = 16_384
COLUMNS = [("id", 20, True), ("n", 23, False), ("ts", 1184, False)]


def frames(transactions: int) -> list[bytes]:
    """The walsender's CopyData frames for ``transactions`` single-row UPDATEs."""

    def framed(lsn: int, payload: bytes) -> bytes:
        return b"w" + struct.pack("!QQq", lsn, lsn, 0) + payload

    lsn = 0x1000_0000
    out = [framed(lsn, pg.relation(OID, "public", "bench", COLUMNS))]
    for xid in range(1000, 1000 + transactions):
        row = [str(xid % 1_000_000).encode(), b"42", b"2026-11-29 11:05:10.123456+00"]
        commit = lsn + 200
        out.append(framed(lsn, pg.begin(commit, xid)))
        out.append(framed(lsn + 40, pg.update(OID, row)))
        out.append(framed(commit, pg.commit(commit, commit + 48)))
        lsn = commit + 48
    return out


# Frames libpq holds after one read of its 16-KB buffer, about: what the receiver
# takes at once (``ReplicationStream.read_all``).
BURST = 128
# What libpq's ``get_copy_data`` gives when no frame is buffered.
_NONE_LEFT = (0, memoryview(b""))


# A burst as libpq's ``get_copy_data`` gives it: each frame's length and bytes, then
# what it gives when no frame is left.
Burst = list[tuple[int, memoryview]]


def bursts(data: list[bytes]) -> list[Burst]:
    """``data``'s frames, ``BURST`` at a time, as libpq holds them after one read."""
    return [
        [(len(f), memoryview(f)) for f in data[at : at + BURST]] + [_NONE_LEFT]
        for at in range(0, len(data), BURST)
    ]


def _holding(burst: Burst) -> GetCopyData:
    """``get_copy_data`` of a libpq that holds ``burst``."""
    taken = iter(burst).__next__
    return lambda _: taken()


def receive(data: list[Burst]) -> int:
    """What the receiver thread does with each frame; the transactions assembled."""
    progress = Progress()
    tracker = TransactionTracker(progress)
    runs = RunDecoder(PgOutputDecoder(3), held=tracker.held)
    assembler = TransactionAssembler()
    assembled = 0
    for burst in data:
        frames: list[tuple[Lsn, bytes]] = []
        run = xlog_frames(_holding(burst), frames)
        assert run.stop_length == 0  # no keepalive is made here
        progress.note_received(unpacked(run.received))
        for decoded in runs.push_all(frames):
            tracker.observe(decoded)
            if assembler.feed(decoded) is not None:
                assembled += 1
    return assembled


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--transactions", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5, help="best of this many")
    args = parser.parse_args()
    made = frames(args.transactions)
    data = bursts(made)
    best = float("inf")
    for _ in range(args.rounds):
        started = time.perf_counter()
        assembled = receive(data)
        best = min(best, time.perf_counter() - started)
        assert assembled == args.transactions, assembled
    per = best / args.transactions * 1e6
    print(
        f"{args.transactions:,} single-row transactions ({len(made):,} frames): "
        f"{best:.2f} s, {per:.1f} us a transaction, {args.transactions / best:,.0f}/s"
    )


if __name__ == "__main__":
    main()
