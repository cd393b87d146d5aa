"""Receive-only vs receive+decode rate of one large transaction, in one run.

Starts a throwaway PostgreSQL (15 by default), creates one slot per pass,
commits one transaction of ``--rows`` rows (bigint key, int, text,
timestamptz, numeric), then streams it from each slot:

- receive: only receiving the frames;
- decode: receiving and decoding every message as the daemon does (row
  changes a run at a time, values into Arrow columns: ``RunDecoder``);
- decode + cast: also casting every column of each run to its typed Arrow
  column (int64, timestamp, decimal...) with the apply side's casts;
- decode one by one: each message on its own (``PgOutputDecoder.decode``),
  the way before runs, for comparison;
- decode + assemble: as the daemon's receiver thread does, up to complete
  transactions of per-row changes for the apply side;
- receive and decode + cast with ``binary: true``: the same values in
  PostgreSQL's binary format, read into the same typed Arrow columns
  (``apply.columns.binary``), beside text mode.

Rates count rows from the first data frame to the Commit, so the server's
own decoding time weighs on every pass alike; each pass runs ``--rounds``
times, in turn with the others, and its best rate is reported.

    .venv/bin/python -m benchmarks.stream_decode --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Final

from apply.arrival.assembly import TransactionAssembler
from apply.columns.columnar import to_arrow
from apply.columns.typemap import resolve
from benchmarks.harness import stop_on_sigterm
from subscriber.replication.commands import StreamOptions
from subscriber.replication.lsn import Lsn
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.progress import HeldProgress
from subscriber.replication.runs import RunDecoder
from subscriber.replication.stream import ReplicationConnection
from subscriber.replication.tuples import RowChanges
from subscriber.runtime.daemon import tune_garbage_collector
from tests.support.pgcluster import DEFAULT_MAJOR, running_cluster
from tests.support.pgdatabase import PgDatabase

PASSES: Final = (
    "receive",
    "decode",
    "decode_typed",
    "decode_one_by_one",
    "decode_assemble",
    "receive_binary",
    "decode_typed_binary",
)


def typed(decoder: PgOutputDecoder, changes: RowChanges, binary: bool = False) -> int:
    """Casts every walked column to its Arrow type, as the apply side's casts do."""
    cast = 0
    for group in changes.groups:
        if group.walked is None:
            continue
        columns = decoder.relations[group.relation_oid].columns
        for column, values in zip(columns, group.walked.new.values, strict=True):
            column_type = resolve(column.type_oid, column.typmod, lambda _: None)
            cast += len(to_arrow(values, column_type, column.name, binary=binary))
    return cast


def _consumed(
    mode: str,
    payload: bytes,
    start: Lsn,
    runs: RunDecoder,
    assembler: TransactionAssembler,
    *,
    binary: bool,
) -> bool:
    """One frame through the pass ``mode``; whether it ended the transaction."""
    decoder = runs.decoder
    if mode == "decode":
        runs.push(payload, start)
    elif mode == "decode_typed":
        for decoded in runs.push(payload, start):
            if isinstance(decoded, RowChanges):
                typed(decoder, decoded, binary)
    elif mode == "decode_one_by_one":
        decoder.decode(payload, start)
    elif mode == "decode_assemble":
        for decoded in runs.push(payload, start):
            if assembler.feed(decoded) is not None:
                return True
    return payload[:1] == b"C"


def stream_rate(db: PgDatabase, slot: str, rows: int, mode: str) -> float:
    binary = mode.endswith("_binary")
    mode = mode.removesuffix("_binary")
    options = StreamOptions(("bench",), binary=binary)
    connection = ReplicationConnection(db.replication_dsn)
    decoder = PgOutputDecoder(options.negotiated_proto(connection.server_version))
    runs = RunDecoder(decoder)
    assembler = TransactionAssembler()
    stream = connection.start_replication(slot, Lsn(0), options, HeldProgress())
    first = 0.0
    try:
        while True:
            data = stream.read()
            if data is None:
                continue
            if not first:
                first = time.perf_counter()
            if _consumed(mode, data.payload, data.data_start, runs, assembler, binary=binary):
                return rows / (time.perf_counter() - first)
    finally:
        stream.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--major", type=int, default=DEFAULT_MAJOR)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many passes each")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    stop_on_sigterm()
    tune_garbage_collector()  # as `pgsub run` does
    with running_cluster(args.major) as cluster:
        db = PgDatabase.create(cluster, "bench")
        db.execute(
            "CREATE TABLE t (id bigint PRIMARY KEY, n int, s text, ts timestamptz,"
            " amount numeric(12,2)); CREATE PUBLICATION bench FOR TABLE t"
        )
        with ReplicationConnection(db.replication_dsn) as connection:
            for round_ in range(args.rounds):
                for mode in PASSES:
                    connection.create_slot(f"{mode}_{round_}")
        db.execute(
            f"INSERT INTO t SELECT g, g % 1000, 'row ' || g, now(), g * 0.01"
            f" FROM generate_series(1, {args.rows}) g"
        )
        # Every pass once per round, in turn, so that a slower moment of the machine
        # or the server's first (cold) decoding does not fall on one pass only.
        rates = dict.fromkeys(PASSES, 0.0)
        for round_ in range(args.rounds):
            for mode in PASSES:
                rate = stream_rate(db, f"{mode}_{round_}", args.rows, mode)
                rates[mode] = max(rates[mode], rate)
    receive, decode = rates["receive"], rates["decode"]
    figures = {
        "rows": args.rows,
        "postgres_major": args.major,
        "rounds": args.rounds,
        "receive_only_rows_per_s": round(receive),
        "receive_decode_rows_per_s": round(decode),
        "decode_share_of_receive": round(decode / receive, 3),
        "receive_decode_typed_rows_per_s": round(rates["decode_typed"]),
        "receive_decode_one_by_one_rows_per_s": round(rates["decode_one_by_one"]),
        "receive_decode_assemble_rows_per_s": round(rates["decode_assemble"]),
        "binary_receive_only_rows_per_s": round(rates["receive_binary"]),
        "binary_receive_decode_typed_rows_per_s": round(rates["decode_typed_binary"]),
    }
    labels = {
        "receive": "receive only",
        "decode": "receive + decode (runs, Arrow columns)",
        "decode_typed": "receive + decode + cast to typed Arrow columns",
        "decode_one_by_one": "receive + decode one message at a time",
        "decode_assemble": "receive + decode + assemble transactions (receiver thread)",
        "receive_binary": "binary: true - receive only",
        "decode_typed_binary": "binary: true - receive + decode + read into typed Arrow columns",
    }
    print("| pass | rows/s | of receive only |\n|---|---|---|")
    for mode in PASSES:
        print(f"| {labels[mode]} | {rates[mode]:,.0f} | {rates[mode] / receive:.0%} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
