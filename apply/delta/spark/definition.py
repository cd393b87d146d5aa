"""How a subscription defines its target tables: their creation and their evolution.

A table is created with only the reader features its data needs
(``apply.core.features``: column mapping, type widening, deletion vectors when
configured), the retention its maintenance keeps (``apply.core.maintenance_policy``),
and pgsub's own properties: the source table, its key, and the subscription
that writes it (``pgsub.subscription``; one per table unless
``shared_tables``). On a local warehouse, a table that needs no table
feature is created by delta-rs (the same first commit, without a Spark
job); any other by Spark, and so is a table made again after it was
deleted (Spark may still hold the deleted table's log). A new schema adds
columns and widens types; a feature a change needs is gained with a
warning, since some readers cannot open it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import structlog

from apply.columns.columnar import arrow_schema
from apply.columns.schema import Evolution, TargetSchema, plan_evolution, quote
from apply.core.errors import ApplyError, TargetTableError
from apply.core.features import (
    CHANGE_DATA_FEED,
    TYPE_WIDENING,
    FeatureMode,
    TableFeatures,
    creation_properties,
    feed_wanted,
    gains,
    size_gain,
)
from apply.core.maintenance_policy import MaintenancePolicy, retention_properties
from apply.delta.spark import sql as delta_sql
from apply.delta.spark.detail import detail
from apply.delta.spark.origins import ROW_TRACKING
from apply.delta.spark.session import SparkErrors, struct
from apply.delta.writer.creation import Created, create_table, delta_rs_creates
from apply.delta.writer.local_tables import described
from apply.delta.writer.protocol import warn_gained
from apply.history.changelog import PREFIX, HistoryMode
from apply.history.versions import VALID_FROM

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

# The table property naming the subscription that writes a target table.
WRITER: Final = "pgsub.subscription"
# How the table is kept: mirror or changelog (apply.history.changelog).
HISTORY: Final = "pgsub.history"
# Up to this much Parquet a widened column is widened by rewriting the table (as a renamed
# or dropped column is, apply.delta.spark.ddl), so that no reader feature is needed; past it, in
# place with Delta's type widening, which delta-rs's readers lack.
SCHEMA_REWRITE_MAX_BYTES: Final = 2**30


@dataclass(frozen=True, slots=True)
class TableDefinition:
    """How one subscription creates and evolves its target tables."""

    subscription: str
    features: TableFeatures
    maintenance: MaintenancePolicy
    track_origin: bool  # new tables get row tracking (*_origin_differs)
    shared_tables: bool  # may write tables another subscription writes
    local: bool  # the warehouse is a folder on this machine (delta-rs may create tables)

    def create(
        self,
        session: SparkSession,
        schema: TargetSchema,
        path: str,
        history: HistoryMode = HistoryMode.MIRROR,
        *,
        by_spark: bool = False,
        hold: bool = False,
    ) -> Created:
        """Create the table, kept as ``history`` says, with the reader features and properties
        it needs (``by_spark``: never by delta-rs): how (``Created``; nothing to say when
        Spark created it). ``hold``: pgsub's own first commit, if it would make one, held
        back for the table's copy to make (``create_table``)."""
        properties, needed = creation_properties(
            [c.name for c in schema.columns], self.features, schema.table
        )
        for gain in needed:
            warn_gained(schema.table, gain)
        properties.update(retention_properties(self.maintenance))
        properties["pgsub.source"] = schema.table
        properties["pgsub.key"] = json.dumps(list(schema.key))
        properties[WRITER] = self.subscription
        properties[HISTORY] = history.value
        if self.track_origin:
            properties[ROW_TRACKING] = "true"
        if self.local and not by_spark and delta_rs_creates(properties):
            # No table feature to enable: pgsub (or delta-rs, for a column that needs one)
            # writes the same first commit as Spark in milliseconds, where Spark's is
            # seconds (the first job of a cold JVM).
            made = create_table(path, arrow_schema(schema.columns), properties, hold=hold)
        else:
            _create_by_spark(session, schema, path, properties)
            made = Created()
        log.info(
            "target table created",
            table=schema.table,
            path=path,
            key=list(schema.key),
            **({"committed": "with its copy"} if made.held is not None else {}),
        )
        return made

    def evolve(
        self,
        session: SparkSession,
        schema: TargetSchema,
        path: str,
        history: HistoryMode = HistoryMode.MIRROR,
    ) -> Evolution:
        """Evolve the table to ``schema``: columns added and widened, features gained; one kept
        otherwise than ``history`` says is refused."""
        if self.local and self._unchanged(schema, path, history):
            return Evolution()
        existing = {
            f.name: f.dataType.simpleString()
            for f in session.read.format("delta").load(path).schema.fields
        }
        evolution = plan_evolution(existing, schema, self.subscription)
        table = delta_sql.table_ref(path)
        properties = delta_sql.properties(session, path)
        self._check_writer(session, schema.table, path, properties)
        if _versions_marked_as_mirror(properties, existing, history):
            # An earlier pgsub recorded a versions table as a mirror (it judged the kept
            # mode by the versions' own columns, which have no key): the columns tell.
            delta_sql.set_properties(session, path, {HISTORY: history.value})
            properties = {**properties, HISTORY: history.value}
            log.info("target table's history property corrected", table=schema.table)
        _check_history(schema.table, path, properties, history, self.subscription)
        widened = [column for column, _, _ in evolution.widen]
        if (
            widened
            and properties.get(TYPE_WIDENING) != "true"
            and _rewrite_widened(session, schema.table, path, evolution.widen, self.features)
        ):
            widened = []  # widened by the rewrite: no reader feature needed
        for gain in gains(
            properties,
            [c.name for c in evolution.add],
            widened,
            self.features,
            schema.table,
        ):
            delta_sql.set_properties(session, path, {gain.property: gain.value})
            warn_gained(schema.table, gain)
        if feed_wanted(properties, self.features):
            delta_sql.set_properties(session, path, {CHANGE_DATA_FEED: "true"})
            log.info(
                "target table records its change data feed",
                table=schema.table,
                detail="from its next commit on; earlier versions have none",
            )
        if evolution.add:
            columns = ", ".join(f"{quote(c.name)} {c.spark_type}" for c in evolution.add)
            session.sql(f"ALTER TABLE {table} ADD COLUMNS ({columns})")
        for column, _old, new in evolution.widen if widened else ():
            session.sql(f"ALTER TABLE {table} ALTER COLUMN {quote(column)} TYPE {new}")
        if evolution.add or evolution.widen:
            log.info(
                "target table schema changed",
                table=schema.table,
                added=[c.name for c in evolution.add],
                widened=[f"{c} {old}->{new}" for c, old, new in evolution.widen],
            )
        unpublished = [name for name in evolution.dropped if not name.startswith(PREFIX)]
        if unpublished:  # pgsub's own (a retyped column's old values) are not the publisher's
            log.info(
                "columns no longer published",
                table=schema.table,
                columns=unpublished,
                note="kept in the Delta table; NULL in rows inserted from now on",
            )
        if properties.get("pgsub.key") != json.dumps(list(schema.key)):
            delta_sql.set_properties(session, path, {"pgsub.key": json.dumps(list(schema.key))})
            log.info("target table key recorded", table=schema.table, key=list(schema.key))
        return evolution

    def _unchanged(self, schema: TargetSchema, path: str, history: HistoryMode) -> bool:
        """Whether the table already is what ``evolve`` would make it, read by delta-rs from
        its log: a restart's first batch of each table then starts no Spark job (a cold
        JVM's first ones took 11 s of a backlog's drain: docs/performance.md). Anything to
        change, or to refuse, is left to Spark's path."""
        found = described(path)
        if found is None:
            return False
        existing, properties = found
        try:
            evolution = plan_evolution(existing, schema, self.subscription)
            _check_history(schema.table, path, properties, history, self.subscription)
            needed = gains(properties, [], [], self.features, schema.table)
        except ApplyError:
            return False
        return not (
            evolution.add
            or evolution.widen
            or evolution.dropped
            or needed
            or feed_wanted(properties, self.features)
            or properties.get(WRITER) != self.subscription
            or properties.get("pgsub.key") != json.dumps(list(schema.key))
        )

    def _check_writer(
        self, session: SparkSession, table: str, path: str, properties: Mapping[str, str]
    ) -> None:
        """One subscription per target table, unless ``shared_tables`` says otherwise.

        Two subscriptions that write one table by mistake (two publications that
        both publish it) would interleave their changes and judge each other's rows
        as conflicts. A table no subscription claims yet (made by an older pgsub, or
        by hand) becomes this one's.
        """
        writer = properties.get(WRITER)
        if writer == self.subscription:
            return
        if writer is None:
            delta_sql.set_properties(session, path, {WRITER: self.subscription})
            return
        if not self.shared_tables:
            raise TargetTableError(
                f'{table} at {path} is written by subscription "{writer}" (its table property '
                f'{WRITER}), and subscription "{self.subscription}" would write it too. If '
                "several publishers feed this table on purpose, or that subscription was "
                f'dropped, set shared_tables: true for "{self.subscription}"; otherwise take '
                "the table out of one of the publications"
            )


def _rewrite_widened(
    session: SparkSession,
    table: str,
    path: str,
    widen: Sequence[tuple[str, str, str]],
    features: TableFeatures,
) -> bool:
    """Widen ``widen``'s columns (name, old type, new type) by rewriting the table, in one
    commit, while it holds at most ``SCHEMA_REWRITE_MAX_BYTES``: the table keeps no trace of
    the narrower type, so every reader still opens it (Delta's type widening is a reader
    feature delta-rs lacks). Whether it did; past the size (and with ``always``), the caller
    widens in place with the feature, or refuses (``never``)."""
    from pyspark.sql import functions as fn

    if features.type_widening is FeatureMode.ALWAYS:
        return False
    _, size, _ = detail(session, path)
    if size > SCHEMA_REWRITE_MAX_BYTES:
        return False
    new = {column: wanted for column, _, wanted in widen}
    frame = delta_sql.read(session, path)
    columns = [
        fn.col(quote(name)).cast(new[name]).alias(name) if name in new else fn.col(quote(name))
        for name in frame.columns
    ]
    writer = frame.select(*columns).write.format("delta").mode("overwrite")
    writer.option("overwriteSchema", "true").save(path)
    log.info(
        "target table rewritten to widen a column",
        table=table,
        widened=[f"{c} {old}->{wanted}" for c, old, wanted in widen],
        bytes=size,
        detail="every reader still opens it; Delta's type widening (a reader feature) only "
        f"widens tables of more than {SCHEMA_REWRITE_MAX_BYTES // 2**30} GiB in place",
    )
    return True


def _versions_marked_as_mirror(
    properties: Mapping[str, str], columns: Mapping[str, str], history: HistoryMode
) -> bool:
    """Whether the table is a versions table that an earlier pgsub marked as a mirror."""
    return (
        history is HistoryMode.SCD2
        and properties.get(HISTORY) == HistoryMode.MIRROR.value
        and VALID_FROM in columns
    )


def _check_history(
    table: str, path: str, properties: Mapping[str, str], history: HistoryMode, subscription: str
) -> None:
    """A mirror is not appended to as a change log, nor a change log merged into as a mirror
    (a table made before ``history`` existed is a mirror)."""
    kept = properties.get(HISTORY, HistoryMode.MIRROR.value)
    if kept == history.value:
        return
    raise TargetTableError(
        f"{table} at {path} is kept as a {kept} (its table property {HISTORY}), and the "
        f'configuration of subscription "{subscription}" says {history.value} (history): '
        f"set it back, or move the Delta table away and copy the table again "
        f"(`pgsub resync -c <config> {subscription} {table}`)"
    )


def _create_by_spark(
    session: SparkSession, schema: TargetSchema, path: str, properties: Mapping[str, str]
) -> None:
    try:
        delta_sql.create_if_not_exists(session, path, schema.ddl(), properties)
        made = delta_sql.is_delta_table(session, path)
    except SparkErrors as exc:
        if "DELTA_TABLE_NOT_FOUND" not in str(exc):
            raise
        made = False
    if not made:
        # IF NOT EXISTS took a _delta_log without a commit for a table and did nothing.
        _create_over_cut_short(session, schema, path, properties)


def _create_over_cut_short(
    session: SparkSession, schema: TargetSchema, path: str, properties: Mapping[str, str]
) -> None:
    """A ``_delta_log`` without a commit (a creation killed half-way): create over it.

    ``CREATE TABLE IF NOT EXISTS`` takes such a folder for a table and does
    nothing (Delta's table builder refused it); a first write does not; a
    write takes only ``delta.*`` properties, so the others follow in a second commit.
    """
    log.warning(
        "target table creation was cut short before; creating it again",
        table=schema.table,
        path=path,
    )
    writer = session.createDataFrame([], struct(schema.ddl())).write.format("delta")
    for name, value in properties.items():
        if name.startswith("delta."):
            writer = writer.option(name, value)
    writer.mode("overwrite").save(path)
    others = {name: value for name, value in properties.items() if not name.startswith("delta.")}
    delta_sql.set_properties(session, path, others)


def gain_by_size(
    session: SparkSession,
    table: str,
    path: str,
    *,
    size: int,
    properties: Mapping[str, str],
    features: TableFeatures,
) -> bool:
    """Turn deletion vectors on for a table grown to ``size`` bytes of Parquet, when
    ``features`` say so (``apply.core.features.size_gain``); whether it did. The files already
    written keep their rows; the next MERGE writes bitmaps instead of rewriting them."""
    gain = size_gain(properties, size, features)
    if gain is None:
        return False
    delta_sql.set_properties(session, path, {gain.property: gain.value})
    warn_gained(table, gain)
    return True
