"""Target Delta tables, written through Spark: with ``delta_copy`` and ``delta_multiset``,
the only code that writes them.

Table ``schema.name`` lives at ``<warehouse>/<schema>/<name>``. Every write
records, atomically with the data, the LSN it brings the table to:

- Delta's idempotent-write id (``txnAppId = pgsub/<subscription>``,
  ``txnVersion`` = the LSN as an integer), so Delta itself refuses to
  commit the same batch twice;
- the LSN in the commit's ``userMetadata`` (JSON), which ``applied_lsn``
  reads back from the table's history after a restart.

Writes run from several threads at once (one MERGE per table of a batch).
Each thread has its own Spark session (``newSession``: same SparkContext,
its own SQL conf), because the idempotent-write settings are session
configuration and must not leak between tables.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from apply.collapse import First, KeyedNet, Net
from apply.delta.copy import copy_into
from apply.delta.findings import Finding, expected_counts, find_keyed
from apply.delta.moved import fill_moved
from apply.delta.multiset import write_multiset
from apply.delta.origins import ROW_TRACKING, OriginTracker
from apply.delta.session import arrow_frame
from apply.errors import TargetTableError
from apply.features import PORTABLE, Gain, TableFeatures, creation_properties, gains
from apply.merge_plan import (
    ClauseKind,
    MergePlan,
    conflict_in,
    key_bounds,
    keyed_merge,
    on_exists,
    shape_of,
)
from apply.records import (
    CommitMark,
    ConflictError,
    SparkErrors,
    Within,
    WriteResult,
    lsn_from_metadata,
    struct,
    within_from_metadata,
)
from apply.resolve import ORIGIN, looks_up_first, origin_looks_up_first, resolve
from apply.schema import Evolution, TargetSchema, plan_evolution, quote
from apply.source import (
    FIRST,
    PRESENT,
    REINSERTED,
    KeyedSource,
    from_key,
    helper_spark_type,
    keyed_source,
)
from conflicts.kinds import DEFAULTS, ConflictKind, Resolution, judge
from subscriber.replication.lsn import ZERO, Lsn
from subscriber.replication.names import table_folder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = structlog.get_logger(__name__)

TXN_APP_ID: Final = "spark.databricks.delta.write.txnAppId"
TXN_VERSION: Final = "spark.databricks.delta.write.txnVersion"
USER_METADATA: Final = "spark.databricks.delta.commitInfo.userMetadata"
LAST_VERSION: Final = "spark.databricks.delta.lastCommitVersionInSession"
HISTORY_PEEK: Final = 100
# The table property naming the subscription that writes a target table.
WRITER: Final = "pgsub.subscription"


class CreatedTables(Protocol):
    """Which target tables a subscription created (``subscriber.runtime.settings``), durably."""

    def was_created(self, table: str) -> bool: ...

    def record_created(self, table: str) -> None: ...


class _Forgetful:
    """No record of created tables (benchmarks, tools): every missing table is created."""

    def was_created(self, table: str) -> bool:
        return False

    def record_created(self, table: str) -> None:
        return None


class DeltaTables:
    """The target tables of one subscription."""

    def __init__(
        self,
        spark: SparkSession,
        warehouse: str,
        subscription: str,
        *,
        create_tables: bool = True,
        track_origin: bool = False,
        features: TableFeatures = PORTABLE,
        shared_tables: bool = False,
        created: CreatedTables | None = None,
    ) -> None:
        self._spark = spark
        self.created = created or _Forgetful()
        self.warehouse = warehouse.rstrip("/")
        self.subscription = subscription
        self.create_tables = create_tables
        self.track_origin = track_origin  # new tables get row tracking (*_origin_differs)
        self.features = features
        self.shared_tables = shared_tables  # may write tables another subscription writes
        self._local = threading.local()
        self._schemas: dict[str, TargetSchema] = {}
        self._origins: dict[str, OriginTracker] = {}
        self._lock = threading.Lock()
        self.history_peek = HISTORY_PEEK

    def path(self, table: str) -> str:
        return f"{self.warehouse}/{table_folder(table)}"

    def session(self) -> SparkSession:
        session: SparkSession | None = getattr(self._local, "session", None)
        if session is None:
            session = self._spark.newSession()
            self._local.session = session
        return session

    def exists(self, table: str) -> bool:
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.session(), self.path(table)))

    # -- progress ------------------------------------------------------------

    def applied_lsn(self, table: str) -> Lsn:
        """The end LSN of the last batch this subscription committed to ``table``."""
        metadata = self._latest_mark(table)
        lsn = lsn_from_metadata(metadata, self.subscription)
        return ZERO if lsn is None else lsn

    def applied_within(self, table: str) -> Within | None:
        """How far into an open transaction the latest commit of this subscription brought
        ``table`` (None: that commit completed its transactions)."""
        return within_from_metadata(self._latest_mark(table), self.subscription)

    def _latest_mark(self, table: str) -> str | None:
        """The ``userMetadata`` of this subscription's latest commit to ``table`` with an LSN.

        A subscription's LSNs only grow, so its newest marked commit holds the
        highest. The last ``history_peek`` commits are read first; the whole
        history only when other writers (or maintenance) made all of those.
        """
        from delta.tables import DeltaTable

        path = self.path(table)
        try:
            session = self.session()
            if not DeltaTable.isDeltaTable(session, path):
                return None
            history = DeltaTable.forPath(session, path).history
            for limit in (self.history_peek, None):
                frame = history(limit) if limit else history()
                rows = frame.select("version", "userMetadata").collect()
                rows.sort(key=lambda row: -int(row["version"]))
                for row in rows:
                    metadata = row["userMetadata"]
                    if lsn_from_metadata(metadata, self.subscription) is not None:
                        return str(metadata)
                if limit is not None and len(rows) < limit:
                    break
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read the history of {path}: {exc}") from exc
        return None

    # -- schema --------------------------------------------------------------

    def prepare(self, schema: TargetSchema, *, recreate: bool = False) -> Evolution | None:
        """Create the table, or evolve it to ``schema``; None when nothing changed.

        A table this subscription created once and that is gone now (deleted by
        someone else) is not created again empty - that would lose its rows
        silently - unless ``recreate`` (a copy that fills it anew).
        """
        with self._lock:
            if self._schemas.get(schema.table) == schema:
                return None
        path = self.path(schema.table)
        try:
            if not self.exists(schema.table):
                if not self.create_tables:
                    raise TargetTableError(
                        f"no Delta table at {path} for {schema.table} and create_tables is off;"
                        " create it, or turn create_tables on"
                    )
                if not recreate and self.created.was_created(schema.table):
                    raise TargetTableError(
                        f"the Delta table of {schema.table} at {path} is gone, though "
                        f'subscription "{self.subscription}" created it: deleted by someone '
                        "else? Its changes are not applied to an empty table. Copy it again: "
                        f"`pgsub resync -c <config> {self.subscription} {schema.table}`"
                    )
                self._create(schema, path)
                self.created.record_created(schema.table)
                evolution = Evolution(add=schema.columns)
            else:
                evolution = self._evolve(schema, path)
        except SparkErrors as exc:
            raise TargetTableError(f"cannot prepare {path} for {schema.table}: {exc}") from exc
        with self._lock:
            self._schemas[schema.table] = schema
        return evolution

    def _create(self, schema: TargetSchema, path: str) -> None:
        from delta.tables import DeltaTable

        session = self.session()
        properties, needed = creation_properties(
            [c.name for c in schema.columns], self.features, schema.table
        )
        for gain in needed:
            _warn_gained(schema.table, gain)
        properties["pgsub.source"] = schema.table
        properties["pgsub.key"] = json.dumps(list(schema.key))
        properties[WRITER] = self.subscription
        if self.track_origin:
            properties[ROW_TRACKING] = "true"
        builder = DeltaTable.createIfNotExists(session).location(path)
        builder = builder.addColumns(struct(schema.ddl()))
        for name, value in properties.items():
            builder = builder.property(name, value)
        try:
            builder.execute()
        except SparkErrors as exc:
            if "DELTA_TABLE_NOT_FOUND" not in str(exc):
                raise
            self._create_over_cut_short(schema, path, properties)
        with self._lock:
            self._origins.pop(schema.table, None)
        log.info("target table created", table=schema.table, path=path, key=list(schema.key))

    def _create_over_cut_short(
        self, schema: TargetSchema, path: str, properties: Mapping[str, str]
    ) -> None:
        """A ``_delta_log`` without a commit (a creation killed half-way): create over it.

        Delta's table builder refuses such a folder, a first write does not; a
        write takes only ``delta.*`` properties, so the others follow in a second commit.
        """
        log.warning(
            "target table creation was cut short before; creating it again",
            table=schema.table,
            path=path,
        )
        session = self.session()
        writer = session.createDataFrame([], struct(schema.ddl())).write.format("delta")
        for name, value in properties.items():
            if name.startswith("delta."):
                writer = writer.option(name, value)
        writer.mode("overwrite").save(path)
        others = ", ".join(
            f"{_sql_string(name)} = {_sql_string(value)}"
            for name, value in properties.items()
            if not name.startswith("delta.")
        )
        session.sql(f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES ({others})")

    def _evolve(self, schema: TargetSchema, path: str) -> Evolution:
        session = self.session()
        existing = {
            f.name: f.dataType.simpleString()
            for f in session.read.format("delta").load(path).schema.fields
        }
        evolution = plan_evolution(existing, schema, self.subscription)
        table = f"delta.{quote(path)}"
        properties = self._properties(path)
        self._check_writer(schema.table, path, properties)
        for gain in gains(
            properties,
            [c.name for c in evolution.add],
            [column for column, _, _ in evolution.widen],
            self.features,
            schema.table,
        ):
            session.sql(
                f"ALTER TABLE {table} SET TBLPROPERTIES "
                f"({_sql_string(gain.property)} = {_sql_string(gain.value)})"
            )
            _warn_gained(schema.table, gain)
        if evolution.add:
            columns = ", ".join(f"{quote(c.name)} {c.spark_type}" for c in evolution.add)
            session.sql(f"ALTER TABLE {table} ADD COLUMNS ({columns})")
        for column, _old, new in evolution.widen:
            session.sql(f"ALTER TABLE {table} ALTER COLUMN {quote(column)} TYPE {new}")
        if evolution.add or evolution.widen:
            log.info(
                "target table schema changed",
                table=schema.table,
                added=[c.name for c in evolution.add],
                widened=[f"{c} {old}->{new}" for c, old, new in evolution.widen],
            )
        if evolution.dropped:
            log.info(
                "columns no longer published",
                table=schema.table,
                columns=list(evolution.dropped),
                note="kept in the Delta table; NULL in rows inserted from now on",
            )
        if properties.get("pgsub.key") != json.dumps(list(schema.key)):
            session.sql(
                f"ALTER TABLE {table} SET TBLPROPERTIES ('pgsub.key' = "
                f"{_sql_string(json.dumps(list(schema.key)))})"
            )
            log.info("target table key recorded", table=schema.table, key=list(schema.key))
        return evolution

    def _check_writer(self, table: str, path: str, properties: Mapping[str, str]) -> None:
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
            self.session().sql(
                f"ALTER TABLE delta.{quote(path)} SET TBLPROPERTIES "
                f"({_sql_string(WRITER)} = {_sql_string(self.subscription)})"
            )
            return
        if not self.shared_tables:
            raise TargetTableError(
                f'{table} at {path} is written by subscription "{writer}" (its table property '
                f'{WRITER}), and subscription "{self.subscription}" would write it too. If '
                "several publishers feed this table on purpose, or that subscription was "
                f'dropped, set shared_tables: true for "{self.subscription}"; otherwise take '
                "the table out of one of the publications"
            )

    def _properties(self, path: str) -> Mapping[str, str]:
        from delta.tables import DeltaTable

        detail = DeltaTable.forPath(self.session(), path).detail().select("properties").first()
        return dict(detail["properties"] or {}) if detail else {}

    # -- writes --------------------------------------------------------------

    @contextmanager
    def marked(self, mark: CommitMark) -> Iterator[SparkSession]:
        """A session whose next Delta commit carries ``mark``."""
        session = self.session()
        conf = session.conf
        app_id, version = mark.txn
        conf.set(TXN_APP_ID, app_id)
        conf.set(TXN_VERSION, str(version))
        conf.set(USER_METADATA, mark.user_metadata())
        conf.unset(LAST_VERSION)
        try:
            yield session
        finally:
            conf.unset(TXN_APP_ID)
            conf.unset(TXN_VERSION)
            conf.unset(USER_METADATA)

    @contextmanager
    def noted(self, mark: CommitMark) -> Iterator[SparkSession]:
        """A session whose next commit is marked ours without bringing the table to an LSN."""
        session = self.session()
        session.conf.set(USER_METADATA, mark.partial_metadata())
        try:
            yield session
        finally:
            session.conf.unset(USER_METADATA)

    def committed_version(self, session: SparkSession) -> int | None:
        value = session.conf.get(LAST_VERSION, None)
        return int(value) if value not in (None, "") else None

    def write(
        self,
        schema: TargetSchema,
        net: Net,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution] = DEFAULTS,
    ) -> WriteResult:
        """Apply ``net`` to the table in one Delta commit marked with ``mark``.

        Conflicts are met with ``resolutions``; one whose action is ``error``
        raises ConflictError and nothing is committed. May be called again
        with the same input: a commit already made for ``mark.lsn`` is not
        made twice.
        """
        path = self.path(schema.table)
        try:
            if isinstance(net, KeyedNet):
                return self._write_keyed(schema, net, mark, path, resolutions)
            return write_multiset(self, schema, net, mark, resolutions)
        except ConflictError:
            raise
        except SparkErrors as exc:
            with self._lock:
                self._schemas.pop(schema.table, None)  # the next attempt looks at it again
            kind = conflict_in(str(exc))
            if kind is not None and isinstance(net, KeyedNet):
                raise self._conflict(schema, net, kind, path) from None
            raise TargetTableError(
                f"writing {schema.table} to {path} at LSN {mark.lsn} failed: {exc}"
            ) from exc

    def frame(self, session: SparkSession, table: pa.Table, schema: TargetSchema) -> DataFrame:
        types = {c.name: c.spark_type for c in schema.columns}
        for position, name in enumerate(schema.key):
            types[from_key(position)] = types[name]
        ddl = ", ".join(
            f"{quote(n)} {types.get(n) or helper_spark_type(n)}" for n in table.column_names
        )
        return arrow_frame(session, table, ddl)

    def _tracker(self, table: str, path: str) -> OriginTracker:
        with self._lock:
            tracker = self._origins.get(table)
        if tracker is None:
            enabled = self._properties(path).get(ROW_TRACKING) == "true"
            tracker = OriginTracker(self.subscription, table, path, enabled)
            if self.track_origin and not enabled:
                log.warning(
                    "update_origin_differs and delete_origin_differs are not detected for"
                    " this table",
                    table=table,
                    path=path,
                    hint=f"it has no row tracking; set its table property {ROW_TRACKING} = true",
                )
            tracker.start(self.session())
            with self._lock:
                self._origins[table] = tracker
        return tracker

    def _write_keyed(
        self,
        schema: TargetSchema,
        net: KeyedNet,
        mark: CommitMark,
        path: str,
        resolutions: Mapping[ConflictKind, Resolution],
    ) -> WriteResult:
        session = self.session()
        origins = self._tracker(schema.table, path)
        if net.truncated:
            return self._write_truncated(schema, net, mark, resolutions, origins)
        first = looks_up_first(resolutions) or any(
            r.first is First.KEY_UPDATE_OLD for r in net.rows.values()
        )
        origin_first = origin_looks_up_first(resolutions)
        if (first or origin_first) and origins.has_new_commits(session):
            origins.catch_up(session)  # the lookup judges against every other writer's rows
        if first or (origin_first and origins.foreign):
            return self._write_looked_up(schema, net, mark, path, resolutions, origins=origins)
        # The default path: the MERGE judges, and is looked at after only when it must be.
        result, source = self._merge_net(schema, net, mark, path, resolutions)
        origins.committed(session, result.version)
        counts = (result.inserted, result.updated, result.deleted)
        if not origins.foreign and counts == expected_counts(source.table):
            return result  # the conflict-free path: nothing more to look at
        before = self._table_frame(path, None if result.version is None else result.version - 1)
        findings = find_keyed(session, schema, net, before, origins.foreign)
        _prune_replaced(origins, session, findings)
        return replace(result, conflicts=tuple(findings))

    def _write_looked_up(
        self,
        schema: TargetSchema,
        net: KeyedNet,
        mark: CommitMark,
        path: str,
        resolutions: Mapping[ConflictKind, Resolution],
        *,
        origins: OriginTracker,
    ) -> WriteResult:
        """Judge the batch's keys against the table first, then MERGE what the actions keep."""
        session = self.session()
        findings = find_keyed(session, schema, net, self._table_frame(path, None), origins.foreign)
        resolved = resolve(net, findings, resolutions)
        if resolved.stop is not None:
            raise ConflictError(resolved.stop.kind, schema.table, list(resolved.findings))
        result, _ = self._merge_net(schema, resolved.net, mark, path, resolutions)
        origins.committed(session, result.version)
        _prune_replaced(origins, session, resolved.findings)
        return replace(result, conflicts=resolved.findings)

    def _merge_net(
        self,
        schema: TargetSchema,
        net: KeyedNet,
        mark: CommitMark,
        path: str,
        resolutions: Mapping[ConflictKind, Resolution],
    ) -> tuple[WriteResult, KeyedSource]:
        source = keyed_source(net, schema)
        stops = on_exists(
            resolutions[ConflictKind.INSERT_EXISTS] is Resolution.ERROR,
            resolutions[ConflictKind.UPDATE_EXISTS] is Resolution.ERROR,
        )
        with self.marked(mark) as session:
            frame = self.frame(session, source.table, schema)
            if source.moved:
                frame = fill_moved(session, frame, schema, source.keep_columns, path)
            bounds = key_bounds(source.table, schema.key[0])
            plan = keyed_merge(schema, source.keep_columns, stops, shape_of(source.table), bounds)
            return self.merge(session, schema, frame, plan, path), source

    def _write_truncated(
        self,
        schema: TargetSchema,
        net: KeyedNet,
        mark: CommitMark,
        resolutions: Mapping[ConflictKind, Resolution],
        origins: OriginTracker,
    ) -> WriteResult:
        """A batch with a TRUNCATE: its chains are judged against an empty table."""
        missing = [
            Finding(kind.value, r.first_tx, r.key, r.image, None)
            for r in net.rows.values()
            if (kind := judge(r.first, False)) is not None and not r.reinserted
        ]
        resolved = resolve(net, missing, resolutions)
        if resolved.stop is not None:
            raise ConflictError(resolved.stop.kind, schema.table, list(resolved.findings))
        table = keyed_source(resolved.net, schema).table
        expects_absent = pc.is_in(
            table[FIRST], pa.array([First.INSERT.value, First.KEY_UPDATE_NEW.value])
        )
        keep = pc.and_(table[PRESENT], pc.or_(expects_absent, table[REINSERTED]))
        rows = table.filter(keep).select([c.name for c in schema.columns])
        result = self.overwrite(schema, rows, mark)
        origins.rewritten(result.version)
        return replace(result, conflicts=resolved.findings)

    def _table_frame(self, path: str, version: int | None) -> DataFrame:
        reader = self.session().read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(path)

    def merge(
        self,
        session: SparkSession,
        schema: TargetSchema,
        frame: DataFrame,
        plan: MergePlan,
        path: str,
    ) -> WriteResult:
        from delta.tables import DeltaTable

        builder = (
            DeltaTable.forPath(session, path).alias("t").merge(frame.alias("s"), plan.condition)
        )
        for clause in plan.clauses:
            condition: Any = clause.condition
            assignments: dict[str, Any] = dict(clause.assignments)
            if clause.kind is ClauseKind.MATCHED_UPDATE:
                builder = builder.whenMatchedUpdate(condition, assignments)
            elif clause.kind is ClauseKind.MATCHED_DELETE:
                builder = builder.whenMatchedDelete(condition)
            else:
                builder = builder.whenNotMatchedInsert(condition, assignments)
        metrics = builder.execute()
        rows = metrics.collect() if metrics is not None else []
        counts = rows[0].asDict() if rows else {}
        return WriteResult(
            schema.table,
            self.committed_version(session),
            inserted=int(counts.get("num_inserted_rows") or 0),
            updated=int(counts.get("num_updated_rows") or 0),
            deleted=int(counts.get("num_deleted_rows") or 0),
        )

    def overwrite(self, schema: TargetSchema, rows: pa.Table, mark: CommitMark) -> WriteResult:
        with self.marked(mark) as session:
            frame = self.frame(session, rows, schema)
            frame.write.format("delta").mode("overwrite").save(self.path(schema.table))
            return WriteResult(
                schema.table, self.committed_version(session), inserted=rows.num_rows
            )

    def copy_into(
        self, schema: TargetSchema, blocks: Iterator[pa.Table], mark: CommitMark, staging: Path
    ) -> tuple[int, int | None]:
        """Replace the table's rows with ``blocks`` (the initial copy); (rows, version).

        ``staging``: a local directory for the blocks (emptied before and after).
        """
        return copy_into(self, schema, blocks, mark, staging)

    def _conflict(self, schema: TargetSchema, net: KeyedNet, kind: str, path: str) -> ConflictError:
        """The MERGE raised: find every conflicting chain, against the unchanged table."""
        findings = find_keyed(self.session(), schema, net, self._table_frame(path, None))
        return ConflictError(kind, schema.table, findings)


def _prune_replaced(
    origins: OriginTracker, session: SparkSession, findings: Sequence[Finding]
) -> None:
    """The batch wrote over other writers' rows: some of their versions may be gone."""
    if any(ConflictKind(f.kind) in ORIGIN for f in findings):
        origins.prune(session)


def _warn_gained(table: str, gain: Gain) -> None:
    log.warning(
        "target table gains a reader feature",
        table=table,
        feature=gain.feature,
        reason=gain.reason,
        detail="readers without this feature (delta-rs 1.6, polars) cannot open the table; "
        "docs/tables.md lists which readers can",
    )


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
