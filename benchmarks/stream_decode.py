"""Receive-only vs receive+decode rate of one large transaction, in one run.

Starts a throwaway PostgreSQL (15 by default), creates two slots, commits one
transaction of ``--rows`` rows (bigint key, int, text, timestamptz, numeric),
then streams it from each slot: once only receiving the frames, once also
decoding every pgoutput message. Rates count rows from the first data frame
to the Commit, so the server's own decoding time weighs on both alike.

    .venv/bin/python -m benchmarks.stream_decode --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import time

from subscriber.commands import StreamOptions
from subscriber.lsn import Lsn
from subscriber.pgoutput import PgOutputDecoder
from subscriber.progress import HeldProgress
from subscriber.stream import ReplicationConnection
from tests.support.pgcluster import DEFAULT_MAJOR, running_cluster
from tests.support.pgdatabase import PgDatabase


def stream_rate(db: PgDatabase, slot: str, rows: int, decode: bool) -> float:
    options = StreamOptions(("bench",))
    connection = ReplicationConnection(db.replication_dsn)
    decoder = PgOutputDecoder(options.negotiated_proto(connection.server_version))
    stream = connection.start_replication(slot, Lsn(0), options, HeldProgress())
    first = 0.0
    try:
        while True:
            data = stream.read()
            if data is None:
                continue
            if not first:
                first = time.perf_counter()
            if decode:
                decoder.decode(data.payload, data.data_start)
            if data.payload[:1] == b"C":
                return rows / (time.perf_counter() - first)
    finally:
        stream.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--major", type=int, default=DEFAULT_MAJOR)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    with running_cluster(args.major) as cluster:
        db = PgDatabase.create(cluster, "bench")
        db.execute(
            "CREATE TABLE t (id bigint PRIMARY KEY, n int, s text, ts timestamptz,"
            " amount numeric(12,2)); CREATE PUBLICATION bench FOR TABLE t"
        )
        with ReplicationConnection(db.replication_dsn) as connection:
            connection.create_slot("receive_only")
            connection.create_slot("receive_decode")
        db.execute(
            f"INSERT INTO t SELECT g, g % 1000, 'row ' || g, now(), g * 0.01"
            f" FROM generate_series(1, {args.rows}) g"
        )
        receive = stream_rate(db, "receive_only", args.rows, decode=False)
        decode = stream_rate(db, "receive_decode", args.rows, decode=True)
    figures = {
        "rows": args.rows,
        "postgres_major": args.major,
        "receive_only_rows_per_s": round(receive),
        "receive_decode_rows_per_s": round(decode),
        "decode_share_of_receive": round(decode / receive, 3),
    }
    print(
        f"| scenario | rows/s |\n|---|---|\n| receive only | {receive:,.0f} |\n"
        f"| receive + decode | {decode:,.0f} ({decode / receive:.0%} of receive only) |"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
