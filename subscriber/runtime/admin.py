"""Administrative commands that write to the state store: skip, enable, disable, refresh, ...

They change what a subscription does the way ``ALTER SUBSCRIPTION`` does,
through the state store under the warehouse; a running daemon re-reads it
within a few seconds, as PostgreSQL's worker re-reads its subscription.
On a local warehouse the state store is read and appended to by delta-rs:
only ``pgsub drop`` (deletes) starts a Spark session of its own, local or
as configured; elsewhere every command does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from apply.core.records import StoredTableState
from apply.delta.files.store_check import StoreError, check_store
from apply.delta.spark.session import SparkSettings, build_session
from apply.delta.state_store import STATE_TABLES, SettingsStore, TableStateStore
from apply.schema_changes.ddl import publisher_setup_sql
from subscriber.replication import session
from subscriber.replication.errors import SubscriberError, UsageError
from subscriber.replication.lsn import Lsn
from subscriber.replication.names import qualified_name, split_qualified
from subscriber.runtime.config import Config, ConfigError, SubscriptionConfig
from subscriber.runtime.settings import ENABLED, SKIP_LSN, TWO_PHASE
from tablesync.publication import published_tables
from tablesync.refresh import plan_refresh, record_refresh
from tablesync.state import TableState
from tablesync.worker import is_sync_slot


class AdminError(SubscriberError):
    """An administrative command that cannot be carried out as asked."""


def spark_on_demand(
    config: Config, app_name: str = "pgsub-admin", *, writes: bool = True
) -> Callable[[], Any]:
    """What starts the command's Spark session when first needed (most never need it); for a
    command that ``writes``, the warehouse's object store checked first
    (``apply.delta.files.store_check``: it writes a probe, which a reader need not be allowed
    to)."""
    if writes:
        try:
            check_store(config.warehouse, f"pgsub {app_name.removeprefix('pgsub-')}")
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
    settings = SparkSettings(
        master=config.spark.master,
        remote=config.spark.remote,
        conf=config.spark_conf(),
        app_name=app_name,
    )
    return functools.cache(lambda: build_session(settings))


def skip(config: Config, subscription: SubscriptionConfig, lsn: Lsn) -> None:
    """``ALTER SUBSCRIPTION ... SKIP (lsn = X)``: skip the transaction finishing at ``lsn``."""
    SettingsStore(spark_on_demand(config), config.warehouse).record(
        subscription.name, SKIP_LSN, str(lsn)
    )


def set_enabled(config: Config, subscription: SubscriptionConfig, enabled: bool) -> None:
    """``ALTER SUBSCRIPTION ... ENABLE / DISABLE``."""
    store = SettingsStore(spark_on_demand(config), config.warehouse)
    store.record(subscription.name, ENABLED, "true" if enabled else "false")


def publisher_setup(subscription: SubscriptionConfig) -> int:
    """Install on the publisher the event triggers that announce schema changes as logical
    messages (``apply.schema_changes.ddl.publisher_setup_sql``), in one transaction; the server's
    version
    number."""
    import psycopg

    try:
        with session.connect(subscription.conninfo()) as conn, conn.transaction():
            conn.execute(publisher_setup_sql())
            return conn.info.server_version
    except psycopg.errors.InsufficientPrivilege as exc:
        raise AdminError(
            f"cannot install pgsub's event triggers as this user: {exc.diag.message_primary}; "
            "event triggers need a superuser: run `pgsub publisher-setup --print` and give the "
            "SQL to one"
        ) from None
    except psycopg.Error as exc:
        raise AdminError(f"cannot install pgsub's event triggers: {exc}") from None


def refresh_publication(
    config: Config, subscription: SubscriptionConfig
) -> tuple[list[str], list[str]]:
    """REFRESH PUBLICATION; the names of the tables added and removed."""
    with session.connect(subscription.conninfo()) as conn:
        published = published_tables(conn, list(subscription.publications))
    spark = spark_on_demand(config)
    store = TableStateStore(spark, config.warehouse)
    refresh = plan_refresh(store.load(subscription.name), published)
    if refresh.added and subscription.copy_data:
        _refuse_copy_under_two_phase(spark, config, subscription, "`pgsub refresh`")
    record_refresh(store, subscription.sync_settings(), refresh)
    return (
        [t.qualified_name for t in refresh.added],
        [qualified_name(s.schema, s.name) for s in refresh.removed],
    )


def resync(config: Config, subscription: SubscriptionConfig, tables: list[str]) -> list[str]:
    """Copy ``tables`` again from the publisher: each goes back to INIT.

    A running daemon stops applying them, and its sync workers copy them
    anew (replacing the Delta table's rows) and hand them back, as for a
    table just added. The qualified names of the tables, as stored.
    """
    spark = spark_on_demand(config)
    _refuse_copy_under_two_phase(spark, config, subscription, "`pgsub resync`")
    store = TableStateStore(spark, config.warehouse)
    known = {qualified_name(s.schema, s.name): s for s in store.load(subscription.name).values()}
    try:
        wanted = [qualified_name(*split_qualified(name)) for name in tables]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise UsageError(
            f"subscription {subscription.name!r} has no table {', '.join(unknown)} "
            f"(it has: {', '.join(sorted(known)) or 'none'}); `pgsub refresh` adds newly "
            "published tables"
        )
    rows = [
        StoredTableState(
            known[n].relid, known[n].schema, known[n].name, TableState.INIT.value, None
        )
        for n in wanted
    ]
    store.record(subscription.name, rows)
    return wanted


def _refuse_copy_under_two_phase(
    spark: Any, config: Config, subscription: SubscriptionConfig, command: str
) -> None:
    """As PostgreSQL refuses REFRESH with copy_data once two_phase is enabled: a table-sync
    worker's catch-up cannot follow a transaction prepared before its copy."""
    state = SettingsStore(spark, config.warehouse).load(subscription.name).get(TWO_PHASE)
    if state == "enabled":
        raise AdminError(
            f"{command} cannot copy tables of subscription {subscription.name!r}: two_phase is "
            "enabled, and a table copied now could miss a transaction prepared before its "
            "copy (PostgreSQL refuses REFRESH with copy_data too). Add tables without a copy "
            "(copy_data: false), or `pgsub drop` the subscription and start it again"
        )


def drop(config: Config, subscription: SubscriptionConfig, *, keep_slot: bool) -> list[str]:
    """DROP SUBSCRIPTION: its slots on the publisher and its state; the Delta tables stay.

    Refused while a daemon streams the subscription (its slot is active).
    The names of the slots dropped.
    """
    dropped: list[str] = []
    if not keep_slot:
        with session.connect(subscription.conninfo()) as conn:
            rows = [
                (name, is_active)
                for name, is_active in conn.execute(
                    "SELECT slot_name, active FROM pg_catalog.pg_replication_slots"
                    " WHERE database = current_database()"
                ).fetchall()
                if name == subscription.slot or is_sync_slot(subscription.name, name)
            ]
            active = [name for name, is_active in rows if is_active]
            if active:
                raise AdminError(
                    f"subscription {subscription.name!r} is being streamed (slot "
                    f"{', '.join(active)} is active): stop the daemon that runs it, or "
                    f"`pgsub disable -c ... {subscription.name}` and wait until it stops"
                )
            for name, _ in rows:
                conn.execute("SELECT pg_catalog.pg_drop_replication_slot(%s)", [name])
                dropped.append(str(name))
    spark = spark_on_demand(config)
    for table in STATE_TABLES:
        table(spark, config.warehouse).forget(subscription.name)
    return dropped
