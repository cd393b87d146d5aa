"""What one subscription is made of, built from its config: the wiring, and nothing else.

``wire`` makes the pieces a subscription's threads share - its settings and
stores under ``_pgsub/``, its Delta tables, the publisher's catalog and
slots, the stream options and the ``ApplyContext`` both worker kinds read -
so that ``subscriber.runtime.subscription.SubscriptionRunner`` only
supervises them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from apply.arrival.spool_layout import SpoolLayout
from apply.core.maintenance_policy import MaintenancePolicy
from apply.delta.spark.session import runs_here
from apply.delta.state_store import ConflictStore, PreparedStore, SettingsStore, TableStateStore
from apply.delta.table_options import TableOptions
from apply.delta.tables import DeltaTables
from apply.worker.pipeline import ApplyContext
from conflicts.reporter import ConflictReporter
from subscriber.metrics import Metrics
from subscriber.replication.catalog import PublisherCatalog
from subscriber.replication.commands import StreamOptions
from subscriber.runtime import logs
from subscriber.runtime.config import SubscriptionConfig
from subscriber.runtime.settings import SubscriptionSettings
from subscriber.runtime.slots import SubscriptionSlots

if TYPE_CHECKING:
    from apply.delta.spark.session import SparkSession


@dataclass(frozen=True, slots=True)
class SubscriptionParts:
    conninfo: str
    spool: Path
    settings: SubscriptionSettings
    tables: DeltaTables
    table_states: TableStateStore
    prepared: PreparedStore
    catalog: PublisherCatalog
    slots: SubscriptionSlots
    reporter: ConflictReporter
    options: StreamOptions
    context: ApplyContext


def wire(
    config: SubscriptionConfig,
    spark: SparkSession,
    warehouse: str,
    metrics: Metrics,
    maintenance: MaintenancePolicy,
    spark_sees_warehouse: bool | None = None,
) -> SubscriptionParts:
    conninfo = config.conninfo()
    spool = config.spool_path(warehouse)
    settings = SubscriptionSettings(config.name, SettingsStore(spark, warehouse))
    options = TableOptions(
        create_tables=config.create_tables,
        track_origin=config.track_origin,
        features=config.table_features.features(),
        shared_tables=config.shared_tables,
        maintenance=maintenance,
        messages_path=config.messages_path,
        history=config.history.history(),
        spark_sees_warehouse=spark_sees_warehouse,
        writer_processes=config.writer_processes,
        writer_setup=logs.configured(),
    )
    tables = DeltaTables(spark, warehouse, config.name, options, created=settings)
    catalog = PublisherCatalog(conninfo)
    reporter = ConflictReporter(config.name, metrics, ConflictStore(spark, warehouse))
    stream = StreamOptions(
        tuple(config.publications),
        binary=config.binary,
        messages=config.messages,
        schema_changes=config.schema_changes,
        streaming=config.streaming,
        two_phase=config.two_phase,
        origin=config.origin,
    )
    # One MERGE per large transaction reads staged files: the executors must see this disk.
    stages_locally = runs_here(spark) and not config.track_origin
    context = ApplyContext(
        subscription=config.name,
        conninfo=conninfo,
        options=stream,
        tables=tables,
        types=catalog.type_row,
        text_forms=catalog.text_forms,
        metrics=metrics,
        reporter=reporter,
        resolutions=config.conflicts.resolutions(),
        bounds=config.batch.bounds(),
        queue=config.batch.queue_bounds(),
        max_delay=config.batch.max_delay,
        min_changes=config.batch.min_changes,
        spool_root=spool,
        status_interval=config.status_interval,
        wal_receiver_timeout=config.wal_receiver_timeout,
        staging=SpoolLayout(spool).staging if stages_locally else None,
    )
    return SubscriptionParts(
        conninfo=conninfo,
        spool=spool,
        settings=settings,
        tables=tables,
        table_states=TableStateStore(spark, warehouse),
        prepared=PreparedStore(spark, warehouse),
        catalog=catalog,
        slots=SubscriptionSlots(config, conninfo, settings),
        reporter=reporter,
        options=stream,
        context=context,
    )
