"""``pgsub demo``: the daemon on embedded defaults, to see it work in one command.

Starts a throwaway PostgreSQL publisher (``subscriber.runtime.embedded``) with two
demo tables (1,000 accounts already there) and a publication; the daemon
copies the existing rows (table sync), and a little traffic follows
(a transaction every half second: a balance change and an event, now and
then a delete), and runs the daemon with local Spark into a local Delta
warehouse, serving /metrics and /status. On Ctrl-C (or after ``--seconds``)
it stops the traffic, lets the daemon catch up, compares every table with
the publisher (read back by delta-rs, so the comparison is made even when
the Spark JVM is gone), says where the Delta tables are, and removes the
publisher. A second Ctrl-C ends it at once, the publisher removed all the same.

The demo owns its publisher and its warehouse's demo tables: each run makes a
new publisher, so it first removes what a previous run left (the demo's
tables and its state under ``_pgsub/``), and refuses a warehouse that holds
anything else.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path

import psycopg
import structlog
from psycopg.types.json import Jsonb

from subscriber.replication.catalog import wal_end
from subscriber.replication.errors import UsageError
from subscriber.replication.lsn import Lsn
from subscriber.runtime.config import (
    Config,
    LogConfig,
    MetricsConfig,
    SparkConfig,
    SubscriptionConfig,
)
from subscriber.runtime.daemon import Daemon
from subscriber.runtime.embedded import DEFAULT_MAJOR, PgCluster
from tablesync.state import TableState

log = structlog.get_logger(__name__)

TABLES = ("accounts", "events")
SCHEMA = """
CREATE TABLE accounts (
    id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12, 2) NOT NULL,
    tags text[], updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE events (
    id bigserial PRIMARY KEY, account_id bigint NOT NULL, kind text NOT NULL,
    payload jsonb, at timestamptz NOT NULL DEFAULT now()
);
CREATE PUBLICATION demo_pub FOR TABLE accounts, events;
"""
SEED = """
INSERT INTO accounts (id, owner, balance, tags)
SELECT g, 'owner ' || g, 100, ARRAY['demo', 'seed'] FROM generate_series(1, 1000) g;
"""


def _traffic(dsn: str, stopping: threading.Event) -> None:
    rng = random.Random(7)  # noqa: S311 - demo data, not security
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stopping.wait(0.5):
            account, amount = rng.randint(1, 1000), rng.randint(-50, 50)
            with conn.transaction():
                conn.execute(
                    "UPDATE accounts SET balance = balance + %s, updated_at = now() WHERE id = %s",
                    [amount, account],
                )
                conn.execute(
                    "INSERT INTO events (account_id, kind, payload) VALUES (%s, 'transfer', %s)",
                    [account, Jsonb({"amount": amount})],
                )
            if rng.random() < 0.1:
                conn.execute("DELETE FROM events WHERE id = (SELECT min(id) FROM events)")


def _publisher(cluster: PgCluster) -> str:
    with cluster.connect() as conn:
        conn.execute("CREATE DATABASE demo")
    dsn = cluster.dsn("demo")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(SEED)  # copied by the table-sync workers
    return dsn


def _wal_end(dsn: str) -> Lsn:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return wal_end(conn)


def clear_previous_run(warehouse: Path) -> None:
    """Remove what an earlier demo left in ``warehouse``: its tables replicated from another
    (now removed) publisher, whose state would stop this run's subscription."""
    if not warehouse.exists():
        return
    ours = {Path("_pgsub"), Path("public"), *(Path("public") / table for table in TABLES)}
    found = {entry.relative_to(warehouse) for entry in warehouse.iterdir()}
    if (warehouse / "public").is_dir():
        found |= {entry.relative_to(warehouse) for entry in (warehouse / "public").iterdir()}
    others = sorted(str(entry) for entry in found - ours)
    if others:
        raise UsageError(
            f"{warehouse} holds more than an earlier demo's tables ({', '.join(others[:5])}); "
            "the demo removes what it finds there, so give it a folder of its own: "
            "`pgsub demo --warehouse <empty folder>`"
        )
    if found:
        log.info("removing an earlier demo run", warehouse=str(warehouse))
        for entry in ("_pgsub", "public"):
            shutil.rmtree(warehouse / entry, ignore_errors=True)


def _catch_up(daemon: Daemon, dsn: str, timeout: float = 300) -> None:
    target = _wal_end(dsn)
    deadline = time.monotonic() + timeout
    log.info("demo catching up before stopping", target_lsn=str(target))
    while time.monotonic() < deadline and daemon.check_spark():
        runner = daemon.runners[0] if daemon.runners else None
        progress = runner.progress if runner is not None else None
        synced = runner is not None and all(
            s.state is TableState.READY for s in runner.coordinator.statuses
        )
        if progress is not None and synced and progress.done_through >= target:
            return
        time.sleep(0.5)


def _report(dsn: str, warehouse: Path) -> bool:
    """Each demo table's rows on the publisher and in Delta (read by delta-rs: no JVM)."""
    from apply.delta.writer.local_tables import is_table, row_count

    same = True
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in TABLES:
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            published = int(row[0]) if row else 0
            path = str(warehouse / "public" / table)
            replicated = row_count(path) if is_table(path) else 0
            same = same and published == replicated
            print(f"{table}: {published} rows on the publisher, {replicated} in Delta at {path}")
    print("Delta tables match the publisher." if same else "Delta differs from the publisher!")
    return same


def run_demo(warehouse: Path, *, seconds: float | None = None, port: int = 9187) -> int:
    clear_previous_run(warehouse)
    cluster = PgCluster(major=DEFAULT_MAJOR).start()
    traffic_stop = threading.Event()
    spool: Path | None = None
    try:
        dsn = _publisher(cluster)
        log.info("demo publisher ready", host="127.0.0.1", port=cluster.port, dbname="demo")
        subscription = SubscriptionConfig(
            name="demo",
            connection=dsn,
            publications=["demo_pub"],
            copy_data=True,
            status_interval=1.0,
        )
        spool = subscription.spool_path(str(warehouse))
        daemon = Daemon(
            Config(
                warehouse=str(warehouse),
                spark=SparkConfig(master="local[2]", start="at_start"),  # its JVM shown at work
                metrics=MetricsConfig(host="127.0.0.1", port=port),
                log=LogConfig(format="auto"),
                subscriptions=[subscription],
            )
        )

        def drain() -> None:
            traffic_stop.set()
            _catch_up(daemon, dsn)

        daemon.before_stop = drain
        threading.Thread(target=_traffic, args=(dsn, traffic_stop), daemon=True).start()
        if seconds is not None:
            timer = threading.Timer(seconds, daemon.stop_requested.set)
            timer.daemon = True
            timer.start()
        code = daemon.run()
        same = _report(dsn, warehouse)
        return code or (0 if same else 1)
    finally:
        traffic_stop.set()
        cluster.destroy()
        if spool is not None:  # the run's spool goes with its publisher
            shutil.rmtree(spool, ignore_errors=True)
