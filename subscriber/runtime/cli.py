"""The ``pgsub`` command line.

- ``pgsub run -c pgsub.yaml``: the daemon.
- ``pgsub status -c pgsub.yaml [SUB]``: each subscription's state, positions,
  lag, errors, conflicts and tables, from the running daemon or the state store.
- ``pgsub refresh -c pgsub.yaml SUB``: REFRESH PUBLICATION; ``pgsub skip
  ... SUB --lsn X/Y``, ``pgsub enable|disable ... SUB``: ALTER SUBSCRIPTION;
  ``pgsub resync ... SUB TABLE...``: copy tables again. They write to the
  state store; a running daemon picks them up.
- ``pgsub drop -c pgsub.yaml SUB``: DROP SUBSCRIPTION (slots and state; the
  Delta tables stay).
- ``pgsub demo``: the daemon on embedded defaults (a throwaway publisher,
  local Spark, a local Delta warehouse).
- ``pgsub peek``: streams a slot and prints the decoded pgoutput messages -
  a pg_recvlogical that speaks pgoutput - for checking a publisher's setup
  and for debugging the protocol.

Exit codes: 0 done, 1 failed, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from types import FrameType
from typing import NoReturn

from subscriber.replication.commands import Streaming, StreamOptions
from subscriber.replication.errors import SubscriberError, UsageError
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Message
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.progress import HeldProgress
from subscriber.replication.stream import ReplicationConnection
from subscriber.runtime import logs
from subscriber.runtime.config import Config, ConfigError, SubscriptionConfig
from subscriber.runtime.config_file import load as load_config
from subscriber.runtime.shutdown import ForcedExit, ShutdownTimedOut

EXIT_USAGE = 2


def _config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        default=os.environ.get("PGSUB_CONFIG"),
        help="the YAML config file (default: PGSUB_CONFIG)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgsub",
        description="PostgreSQL logical replication subscriber that applies to Delta Lake.",
    )
    parser.add_argument("--version", action="version", version=f"pgsub {version('pgsub')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="run the daemon: replicate every enabled subscription into Delta",
        description="Replicate every enabled subscription of the config into Delta tables "
        "until SIGTERM or SIGINT. Every config key can be overridden from the environment "
        "as PGSUB_<PATH> (e.g. PGSUB_WAREHOUSE, PGSUB_SUBSCRIPTIONS_0_CONNECTION).",
    )
    _config_argument(run)
    status = commands.add_parser(
        "status",
        help="each subscription's state, positions, lag, errors, conflicts and tables",
        description="What PostgreSQL shows in pg_stat_subscription, pg_subscription_rel and "
        "pg_stat_subscription_stats, in one view: per subscription its state, received / "
        "flushed / latest end LSN, lag in bytes and seconds, apply and sync errors, "
        "conflicts by kind and the last error with its transaction's finish LSN; per table "
        "its state (i/d/f/w/c/s/r), LSN, copy progress, Delta version and files. From the "
        "running daemon's /status when one answers on the config's metrics port, otherwise "
        "from the state store and the publisher's slot (read by delta-rs on a local warehouse; "
        "elsewhere it starts Spark, a few seconds); the "
        "first line says which. Exit 1 when a subscription is in error.",
    )
    status.add_argument("subscription", nargs="?", help="only this subscription")
    status.add_argument("--json", action="store_true", help="the whole view as JSON")
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )
    _config_argument(status)
    refresh = commands.add_parser(
        "refresh",
        help="REFRESH PUBLICATION: add newly published tables, stop applying removed ones",
        description="Compare what the subscription's publications publish now with its tables: "
        "new tables start at INIT (READY with copy_data: false), tables no longer published "
        "stop being applied (their Delta tables are kept, their sync slots dropped). A running "
        "daemon picks the change up within a few seconds.",
    )
    refresh.add_argument("subscription", help="the subscription's name in the config")
    _config_argument(refresh)
    skip = commands.add_parser(
        "skip",
        help="skip the remote transaction that finishes at an LSN (ALTER SUBSCRIPTION SKIP)",
        description="The next time the transaction whose finish LSN is LSN arrives, it is "
        "applied as empty, logged, and the setting cleared. The LSN is the one an apply error "
        "names ('... in transaction 725 finished at 0/14C0378'). A running daemon picks it up "
        "within a few seconds.",
    )
    skip.add_argument("subscription", help="the subscription's name in the config")
    skip.add_argument("--lsn", required=True, help="the transaction's finish LSN, X/Y")
    _config_argument(skip)
    for verb, text, bound in (
        ("enable", "resume", "starts streaming again within a few seconds"),
        (
            "disable",
            "stop",
            "stops streaming within 5 seconds, plus the time to finish the batch it is "
            "writing (a Delta commit is atomic: the batch is committed whole or not at all); "
            "its slot keeps the publisher's WAL until it is enabled again",
        ),
    ):
        toggle = commands.add_parser(
            verb,
            help=f"{text} applying a subscription (ALTER SUBSCRIPTION {verb.upper()})",
            description=f"{text.capitalize()} applying the subscription. A running daemon {bound}.",
        )
        toggle.add_argument("subscription", help="the subscription's name in the config")
        _config_argument(toggle)
    resync = commands.add_parser(
        "resync",
        help="copy tables again from the publisher (back to INIT)",
        description="Each TABLE goes back to INIT: a running daemon stops applying it within "
        "a few seconds, copies it anew under a new snapshot (replacing the Delta table's rows) "
        "and hands it back to the apply worker. The way out of a type change Delta cannot "
        "widen, a target table deleted or changed by hand, or a partly applied skipped "
        "transaction.",
    )
    resync.add_argument("subscription", help="the subscription's name in the config")
    resync.add_argument("tables", nargs="+", metavar="TABLE", help="schema.table (or table)")
    _config_argument(resync)
    drop = commands.add_parser(
        "drop",
        help="DROP SUBSCRIPTION: drop its slots and its state, keep its Delta tables",
        description="Drop the subscription's replication slot and sync slots on the publisher "
        "and everything the state store holds for it (positions, table states, settings, "
        "conflicts); its Delta tables are kept. Refused while a daemon streams it. Run the "
        "daemon again afterwards and the subscription starts over: a new slot, every table "
        "copied anew (copy_data).",
    )
    drop.add_argument("subscription", help="the subscription's name in the config")
    drop.add_argument(
        "--keep-slot",
        action="store_true",
        help="leave the publisher alone (it is gone, or the slot is wanted elsewhere)",
    )
    _config_argument(drop)
    setup = commands.add_parser(
        "publisher-setup",
        help="install on the publisher the event triggers that announce schema changes",
        description="Install (or update) on the subscription's publisher database two event "
        "triggers that emit each ALTER TABLE of a published table as a transactional logical "
        "message, so that pgsub renames, drops and retypes the Delta table's columns at that "
        "point in the stream instead of guessing from the new column list "
        "(docs/tables.md, 'Schema changes'). Needs a superuser; --print prints the SQL for a "
        "DBA to run instead. Messages reach pgsub from PostgreSQL 14 on.",
    )
    setup.add_argument(
        "subscription", nargs="?", help="the subscription's name in the config (not with --print)"
    )
    setup.add_argument(
        "--print",
        action="store_true",
        dest="print_sql",
        help="print the SQL instead of running it",
    )
    _config_argument(setup)
    demo = commands.add_parser(
        "demo",
        help="run the daemon against a throwaway demo publisher into ./warehouse",
        description="Start a throwaway PostgreSQL publisher with demo tables and traffic, and "
        "replicate it with local Spark into a local Delta warehouse until Ctrl-C (or --seconds); "
        "then compare the tables with the publisher. Needs `make setup` (PostgreSQL binaries, "
        "Delta jars).",
    )
    demo.add_argument("--warehouse", type=Path, default=Path("warehouse"), help="Delta root")
    demo.add_argument("--seconds", type=float, default=None, help="stop after this long")
    demo.add_argument("--port", type=int, default=9187, help="HTTP port for /metrics, /status")
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


def _subscription(args: argparse.Namespace) -> tuple[Config, SubscriptionConfig]:
    """The config and the subscription a command names (ConfigError: exit 2)."""
    config = load_config(args.config)
    subscription = config.subscription(args.subscription)
    logs.configure(config.log.format, config.log.level)
    return config, subscription


def _admin(args: argparse.Namespace) -> int:
    try:
        lsn = Lsn.parse(args.lsn) if args.command == "skip" else None
    except ValueError as exc:
        raise ConfigError(f"--lsn: {exc}") from None
    config, subscription = _subscription(args)
    from subscriber.runtime import admin

    if lsn is not None:
        admin.skip(config, subscription, lsn)
        print(f"{subscription.name}: the transaction finishing at {lsn} will be skipped")
    else:
        admin.set_enabled(config, subscription, args.command == "enable")
        print(f"{subscription.name}: {args.command}d")
    return 0


def _resync_or_drop(args: argparse.Namespace) -> int:
    config, subscription = _subscription(args)
    from subscriber.runtime import admin

    if args.command == "resync":
        for name in admin.resync(config, subscription, list(args.tables)):
            print(f"{subscription.name}: {name} will be copied again")
        return 0
    dropped = admin.drop(config, subscription, keep_slot=args.keep_slot)
    for slot in dropped:
        print(f"{subscription.name}: replication slot {slot} dropped")
    print(f"{subscription.name}: dropped (its Delta tables are kept)")
    return 0


def _publisher_setup(args: argparse.Namespace) -> int:
    from apply.schema_changes.ddl import publisher_setup_sql

    if args.print_sql:
        print(publisher_setup_sql(), end="")
        return 0
    if args.subscription is None:
        print("pgsub publisher-setup: name a subscription, or pass --print", file=sys.stderr)
        return EXIT_USAGE
    _, subscription = _subscription(args)
    from subscriber.runtime import admin

    version = admin.publisher_setup(subscription)
    print(f"{subscription.name}: schema change event triggers installed on the publisher")
    if version < 140000:
        print(
            f"{subscription.name}: PostgreSQL {version // 10000} sends no logical messages "
            "to a subscriber (14+ does): its schema changes are still guessed",
            file=sys.stderr,
        )
    return 0


def _status(args: argparse.Namespace) -> int:
    from subscriber.runtime import status

    config = load_config(args.config)
    names = [s.name for s in config.subscriptions]
    if args.subscription is not None:
        names = [config.subscription(args.subscription).name]
    color = sys.stdout.isatty() and not args.json and "NO_COLOR" not in os.environ
    while True:
        view = status.from_daemon(config)
        if view is None:
            view = status.from_state_store(config, names)
        view = status.only(view, args.subscription)
        if args.json:
            print(json.dumps(view, indent=2, default=str), flush=True)
        else:
            screen = status.render(view, color=color)
            print(("\033[H\033[2J" if args.watch and color else "") + screen, flush=True)
        if args.watch is None:
            failing = any(s.get("state") == "error" for s in view["subscriptions"])
            return 1 if failing else 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def _refresh(args: argparse.Namespace) -> int:
    config, subscription = _subscription(args)
    from subscriber.runtime.admin import refresh_publication

    added, removed = refresh_publication(config, subscription)
    print(f"{subscription.name}: {len(added)} table(s) added, {len(removed)} removed")
    for name in added:
        print(f"  + {name}")
    for name in removed:
        print(f"  - {name}")
    return 0


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"pgsub run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not config.subscriptions:
        print("pgsub run: the config names no subscriptions", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(config.log.format, config.log.level)
    from subscriber.runtime.daemon import Daemon

    return Daemon(config).run()


def _demo(args: argparse.Namespace) -> int:
    from subscriber.runtime.demo import run_demo

    logs.configure("auto")
    return run_demo(args.warehouse.resolve(), seconds=args.seconds, port=args.port)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run,
    "refresh": _refresh,
    "status": _status,
    "skip": _admin,
    "enable": _admin,
    "disable": _admin,
    "resync": _resync_or_drop,
    "drop": _resync_or_drop,
    "demo": _demo,
    "peek": _peek,
    "publisher-setup": _publisher_setup,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure()
    command = _COMMANDS.get(args.command)
    try:
        if command is not None:
            return command(args)
    except (ForcedExit, ShutdownTimedOut) as exc:
        # Threads may still be running (a MERGE, a JVM call): exit without waiting for them.
        # Every finally on the way here has run (the demo's publisher is gone).
        print(f"pgsub {args.command}: {exc}", file=sys.stderr)
        _exit_now(exc.exit_code)
    except KeyboardInterrupt:
        print(f"pgsub {args.command}: interrupted", file=sys.stderr)
        return 130
    except ConfigError as exc:
        print(f"pgsub {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SubscriberError as exc:
        print(f"pgsub {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else 1
    finally:
        _release_spark_connect()
    return EXIT_USAGE


def _exit_now(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _release_spark_connect() -> None:
    """End the Spark Connect sessions a command opened (an open one blocks the exit)."""
    session = sys.modules.get("apply.delta.spark.session")  # not imported: no Spark was needed
    if session is not None:
        session.stop_sessions()


if __name__ == "__main__":
    sys.exit(main())
