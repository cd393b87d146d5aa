"""The ``pgsub`` command line.

The daemon commands of DESIGN section 10 (run, status, skip, enable,
disable, refresh, resync, drop) arrive with the apply worker; what exists
today is ``pgsub peek``, which streams a slot and prints the decoded
pgoutput messages - a pg_recvlogical that speaks pgoutput - for checking a
publisher's setup and for debugging the protocol.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import version
from types import FrameType

from subscriber import logs
from subscriber.commands import Streaming, StreamOptions
from subscriber.errors import SubscriberError
from subscriber.lsn import Lsn
from subscriber.messages import Message
from subscriber.pgoutput import PgOutputDecoder
from subscriber.progress import HeldProgress
from subscriber.stream import ReplicationConnection

EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgsub",
        description="PostgreSQL logical replication subscriber that applies to Delta Lake.",
    )
    parser.add_argument("--version", action="version", version=f"pgsub {version('pgsub')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    peek = commands.add_parser(
        "peek",
        help="stream a replication slot and print the decoded pgoutput messages",
        description="Stream SLOT and print each decoded message, one per line. Progress is "
        "never confirmed, so the slot is left where it was. The connection string comes from "
        "--dsn or PGSUB_DSN (its password from PGPASSWORD or ~/.pgpass).",
    )
    peek.add_argument("slot", help="an existing logical replication slot (pgoutput)")
    peek.add_argument(
        "--dsn",
        default=os.environ.get("PGSUB_DSN"),
        help="libpq connection string of the publisher database",
    )
    peek.add_argument(
        "--publication",
        "-p",
        action="append",
        required=True,
        help="publication name (repeat for several)",
    )
    peek.add_argument("--binary", action="store_true", help="ask for binary values")
    peek.add_argument("--messages", action="store_true", help="include logical messages")
    peek.add_argument("--streaming", choices=[s.value for s in Streaming], default="off")
    peek.add_argument("--two-phase", action="store_true")
    peek.add_argument("--limit", type=int, default=0, help="stop after this many messages")
    return parser


def _peek(args: argparse.Namespace) -> int:
    if not args.dsn:
        print("pgsub peek: no connection string: pass --dsn or set PGSUB_DSN", file=sys.stderr)
        return EXIT_USAGE
    options = StreamOptions(
        tuple(args.publication),
        binary=args.binary,
        messages=args.messages,
        streaming=Streaming(args.streaming),
        two_phase=args.two_phase,
    )
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    connection = ReplicationConnection(args.dsn)
    decoder = PgOutputDecoder(
        options.negotiated_proto(connection.server_version),
        parallel_streaming=options.streaming is Streaming.PARALLEL,
    )
    stream = connection.start_replication(args.slot, Lsn(0), options, HeldProgress())
    printed = 0
    try:
        while not stopping and (args.limit == 0 or printed < args.limit):
            data = stream.read(timeout=0.5)
            if data is None:
                continue
            message: Message = decoder.decode(data.payload, data.data_start)
            print(f"{data.data_start} {message}", flush=True)
            printed += 1
    finally:
        stream.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure()
    try:
        if args.command == "peek":
            return _peek(args)
    except SubscriberError as exc:
        print(f"pgsub {args.command}: {exc}", file=sys.stderr)
        return 1
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
