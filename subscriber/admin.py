"""Administrative commands that write to the state store (DESIGN section 10).

They change what a subscription does the way ``ALTER SUBSCRIPTION`` does,
through the state store under the warehouse; a running daemon re-reads it
within a few seconds, as PostgreSQL's worker re-reads its subscription.
They start their own (local or configured) Spark session to write it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from apply.spark_session import SparkSettings, build_session
from apply.state_store import SettingsStore, TableStateStore
from subscriber.config import Config, SubscriptionConfig
from subscriber.lsn import Lsn
from subscriber.settings import ENABLED, SKIP_LSN
from tablesync.coordinator import plan_refresh, record_refresh
from tablesync.publication import published_tables


def _spark(config: Config) -> Any:
    return build_session(
        SparkSettings(
            master=config.spark.master,
            remote=config.spark.remote,
            conf=config.spark.conf,
            app_name="pgsub-admin",
        )
    )


def skip(config: Config, subscription: SubscriptionConfig, lsn: Lsn) -> None:
    """``ALTER SUBSCRIPTION ... SKIP (lsn = X)``: skip the transaction finishing at ``lsn``."""
    SettingsStore(_spark(config), config.warehouse).record(subscription.name, SKIP_LSN, str(lsn))


def set_enabled(config: Config, subscription: SubscriptionConfig, enabled: bool) -> None:
    """``ALTER SUBSCRIPTION ... ENABLE / DISABLE``."""
    store = SettingsStore(_spark(config), config.warehouse)
    store.record(subscription.name, ENABLED, "true" if enabled else "false")


def refresh_publication(
    config: Config, subscription: SubscriptionConfig
) -> tuple[list[str], list[str]]:
    """REFRESH PUBLICATION; the names of the tables added and removed."""
    with psycopg.connect(subscription.conninfo(), autocommit=True) as conn:
        published = published_tables(conn, list(subscription.publications))
    spark = build_session(
        SparkSettings(
            master=config.spark.master,
            remote=config.spark.remote,
            conf=config.spark.conf,
            app_name="pgsub-admin",
        )
    )
    store = TableStateStore(spark, config.warehouse)
    refresh = plan_refresh(store.load(subscription.name), published)
    record_refresh(store, subscription, refresh)
    return (
        [t.qualified_name for t in refresh.added],
        [f"{s.schema}.{s.name}" for s in refresh.removed],
    )
