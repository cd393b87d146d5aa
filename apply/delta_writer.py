"""Target Delta tables, written through Spark: the only module that writes them.

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
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import pyarrow as pa
import pyarrow.compute as pc
import structlog
from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException

from apply.collapse import First, KeyedNet, MultisetNet, Net
from apply.delta_conflicts import Finding, expected_counts, find_keyed
from apply.delta_origins import ROW_TRACKING, OriginTracker
from apply.errors import ApplyError, TargetTableError
from apply.merge_plan import (
    REMOVE,
    ClauseKind,
    MergePlan,
    conflict_in,
    keyed_merge,
    multiset_merge,
    on_exists,
    shape_of,
)
from apply.schema import Evolution, TargetSchema, plan_evolution, quote
from apply.source import (
    COUNT,
    FIRST,
    PRESENT,
    REINSERTED,
    ROW,
    TX,
    KeyedSource,
    from_key,
    keep_flag,
    keyed_source,
    multiset_source,
)
from apply.source import (
    empty as source_empty,
)
from conflicts.kinds import DEFAULTS, ConflictKind, Resolution, judge
from conflicts.resolve import ORIGIN, looks_up_first, origin_looks_up_first, resolve
from subscriber.lsn import ZERO, Lsn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = structlog.get_logger(__name__)

TXN_APP_ID: Final = "spark.databricks.delta.write.txnAppId"
TXN_VERSION: Final = "spark.databricks.delta.write.txnVersion"
USER_METADATA: Final = "spark.databricks.delta.commitInfo.userMetadata"
LAST_VERSION: Final = "spark.databricks.delta.lastCommitVersionInSession"
HISTORY_PEEK: Final = 100

_HELPER_TYPES: Final = {FIRST: "string", PRESENT: "boolean", REINSERTED: "boolean", TX: "int"}
SparkErrors = (PySparkException, Py4JError)


class ConflictError(ApplyError):
    """A remote change conflicts with the target and the configured action is to stop."""

    def __init__(self, kind: str, table: str, findings: list[Finding]) -> None:
        self.kind = kind
        self.table = table
        self.findings = findings
        stopping = [f for f in findings if f.kind == kind]
        self.tx_index = stopping[0].tx_index if stopping else 0
        super().__init__(f'conflict detected on relation "{table}": conflict={kind}')


@dataclass(frozen=True, slots=True)
class CommitMark:
    """What a write records about itself in the table's history."""

    subscription: str
    lsn: Lsn
    commit_time: int  # microseconds since the PostgreSQL epoch

    def user_metadata(self) -> str:
        return json.dumps(
            {"pgsub": {"subscription": self.subscription, "lsn": str(self.lsn)}},
            separators=(",", ":"),
        )

    def partial_metadata(self) -> str:
        """The mark of a commit that is ours but brings the table to no LSN (a copy's block)."""
        return json.dumps(
            {"pgsub": {"subscription": self.subscription, "copy": "partial"}},
            separators=(",", ":"),
        )


@dataclass(frozen=True, slots=True)
class WriteResult:
    table: str
    version: int | None  # the Delta version committed; None when nothing was written
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    conflicts: tuple[Finding, ...] = ()


def _lsn_from_metadata(text: str | None, subscription: str) -> Lsn | None:
    if not text:
        return None
    try:
        mark = json.loads(text).get("pgsub", {})
        if mark.get("subscription") == subscription:
            return Lsn.parse(mark["lsn"])
    except (ValueError, AttributeError, KeyError, TypeError):
        return None
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
    ) -> None:
        self._spark = spark
        self.warehouse = warehouse.rstrip("/")
        self.subscription = subscription
        self.create_tables = create_tables
        self.track_origin = track_origin  # new tables get row tracking (*_origin_differs)
        self._local = threading.local()
        self._schemas: dict[str, TargetSchema] = {}
        self._origins: dict[str, OriginTracker] = {}
        self._lock = threading.Lock()

    def path(self, table: str) -> str:
        schema, _, name = table.partition(".")
        return f"{self.warehouse}/{schema}/{name}"

    def _session(self) -> SparkSession:
        session: SparkSession | None = getattr(self._local, "session", None)
        if session is None:
            session = self._spark.newSession()
            self._local.session = session
        return session

    def exists(self, table: str) -> bool:
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self._session(), self.path(table)))

    # -- progress ------------------------------------------------------------

    def applied_lsn(self, table: str) -> Lsn:
        """The end LSN of the last batch this subscription committed to ``table``."""
        from delta.tables import DeltaTable

        path = self.path(table)
        try:
            session = self._session()
            if not DeltaTable.isDeltaTable(session, path):
                return ZERO
            history = DeltaTable.forPath(session, path).history
            for limit in (HISTORY_PEEK, None):
                frame = history(limit) if limit else history()
                rows = frame.select("version", "userMetadata").orderBy("version").collect()
                lsns = [_lsn_from_metadata(r["userMetadata"], self.subscription) for r in rows]
                found = [lsn for lsn in lsns if lsn is not None]
                if found:
                    return max(found)
                if limit is not None and len(rows) < limit:
                    break
        except SparkErrors as exc:
            raise TargetTableError(f"cannot read the history of {path}: {exc}") from exc
        return ZERO

    # -- schema --------------------------------------------------------------

    def prepare(self, schema: TargetSchema) -> Evolution | None:
        """Create the table, or evolve it to ``schema``; None when nothing changed."""
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
                self._create(schema, path)
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

        session = self._session()
        builder = (
            DeltaTable.createIfNotExists(session)
            .location(path)
            .addColumns(_struct(schema.ddl()))
            .property("delta.columnMapping.mode", "name")
            .property("delta.enableTypeWidening", "true")
            .property("pgsub.source", schema.table)
            .property("pgsub.key", json.dumps(list(schema.key)))
        )
        if self.track_origin:
            builder = builder.property(ROW_TRACKING, "true")
        builder.execute()
        with self._lock:
            self._origins.pop(schema.table, None)
        log.info("target table created", table=schema.table, path=path, key=list(schema.key))

    def _evolve(self, schema: TargetSchema, path: str) -> Evolution:
        session = self._session()
        existing = {
            f.name: f.dataType.simpleString()
            for f in session.read.format("delta").load(path).schema.fields
        }
        evolution = plan_evolution(existing, schema, self.subscription)
        table = f"delta.{quote(path)}"
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
        properties = self._properties(path)
        if properties.get("pgsub.key") != json.dumps(list(schema.key)):
            session.sql(
                f"ALTER TABLE {table} SET TBLPROPERTIES ('pgsub.key' = "
                f"{_sql_string(json.dumps(list(schema.key)))})"
            )
            log.info("target table key recorded", table=schema.table, key=list(schema.key))
        return evolution

    def _properties(self, path: str) -> Mapping[str, str]:
        from delta.tables import DeltaTable

        detail = DeltaTable.forPath(self._session(), path).detail().select("properties").first()
        return dict(detail["properties"] or {}) if detail else {}

    # -- writes --------------------------------------------------------------

    @contextmanager
    def _marked(self, mark: CommitMark) -> Iterator[SparkSession]:
        """A session whose next Delta commit carries ``mark``."""
        session = self._session()
        conf = session.conf
        conf.set(TXN_APP_ID, f"pgsub/{mark.subscription}")
        conf.set(TXN_VERSION, str(int(mark.lsn)))
        conf.set(USER_METADATA, mark.user_metadata())
        conf.unset(LAST_VERSION)
        try:
            yield session
        finally:
            conf.unset(TXN_APP_ID)
            conf.unset(TXN_VERSION)
            conf.unset(USER_METADATA)

    @contextmanager
    def _noted(self, mark: CommitMark) -> Iterator[SparkSession]:
        """A session whose next commit is marked ours without bringing the table to an LSN."""
        session = self._session()
        session.conf.set(USER_METADATA, mark.partial_metadata())
        try:
            yield session
        finally:
            session.conf.unset(USER_METADATA)

    def _committed_version(self, session: SparkSession) -> int | None:
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
            return self._write_multiset(schema, net, mark, path, resolutions)
        except ConflictError:
            raise
        except SparkErrors as exc:
            kind = conflict_in(str(exc))
            if kind is not None and isinstance(net, KeyedNet):
                raise self._conflict(schema, net, kind, path) from None
            raise TargetTableError(
                f"writing {schema.table} to {path} at LSN {mark.lsn} failed: {exc}"
            ) from exc

    def _frame(self, session: SparkSession, table: pa.Table, schema: TargetSchema) -> DataFrame:
        types = {c.name: c.spark_type for c in schema.columns}
        for position, name in enumerate(schema.key):
            types[from_key(position)] = types[name]
        ddl = ", ".join(
            f"{quote(n)} {types.get(n) or _HELPER_TYPES.get(n) or _helper_type(n)}"
            for n in table.column_names
        )
        return session.createDataFrame(table, schema=_struct(ddl))

    def _tracker(self, table: str, path: str) -> OriginTracker:
        with self._lock:
            tracker = self._origins.get(table)
        if tracker is None:
            enabled = self._properties(path).get(ROW_TRACKING) == "true"
            tracker = OriginTracker(self.subscription, table, path, enabled)
            tracker.start(self._session())
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
        session = self._session()
        origins = self._tracker(schema.table, path)
        if net.truncated:
            return self._write_truncated(schema, net, mark, resolutions, origins)
        first = looks_up_first(resolutions) or any(
            r.first is First.KEY_UPDATE_OLD for r in net.rows.values()
        )
        if not first and origin_looks_up_first(resolutions) and origins.has_new_commits(session):
            origins.catch_up(session)
        if first or (origin_looks_up_first(resolutions) and origins.foreign):
            return self._write_looked_up(schema, net, mark, path, resolutions)
        # The default path: the MERGE judges, and is looked at after only when it must be.
        result, source = self._merge_net(schema, net, mark, path, resolutions)
        origins.committed(session, result.version, before=True)
        counts = (result.inserted, result.updated, result.deleted)
        if not origins.foreign and counts == expected_counts(source.table):
            return result  # the conflict-free path: nothing more to look at
        before = self._table_frame(path, None if result.version is None else result.version - 1)
        findings = find_keyed(session, schema, net, before, origins.foreign)
        if any(ConflictKind(f.kind) in ORIGIN for f in findings):
            origins.prune(session)  # the batch made some of those rows ours
        return replace(result, conflicts=tuple(findings))

    def _write_looked_up(
        self,
        schema: TargetSchema,
        net: KeyedNet,
        mark: CommitMark,
        path: str,
        resolutions: Mapping[ConflictKind, Resolution],
    ) -> WriteResult:
        """Judge the batch's keys against the table first, then MERGE what the actions keep."""
        session = self._session()
        origins = self._tracker(schema.table, path)
        if origins.has_new_commits(session):
            origins.catch_up(session)
        findings = find_keyed(session, schema, net, self._table_frame(path, None), origins.foreign)
        resolved = resolve(net, findings, resolutions)
        if resolved.stop is not None:
            raise ConflictError(resolved.stop.kind, schema.table, list(resolved.findings))
        result, _ = self._merge_net(schema, resolved.net, mark, path, resolutions)
        origins.committed(session, result.version, before=True)
        if any(ConflictKind(f.kind) in ORIGIN for f in resolved.findings):
            origins.prune(session)
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
        with self._marked(mark) as session:
            frame = self._frame(session, source.table, schema)
            if source.moved:
                frame = self._fill_moved(session, frame, schema, source.keep_columns, path)
            plan = keyed_merge(schema, source.keep_columns, stops, shape_of(source.table))
            return self._merge(session, schema, frame, plan, path), source

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
        result = self._overwrite(schema, rows, mark)
        origins.rewritten(result.version)
        return replace(result, conflicts=resolved.findings)

    def _table_frame(self, path: str, version: int | None) -> DataFrame:
        reader = self._session().read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(path)

    def _fill_moved(
        self,
        session: SparkSession,
        frame: DataFrame,
        schema: TargetSchema,
        keep_columns: tuple[int, ...],
        path: str,
    ) -> DataFrame:
        """Take kept (unchanged TOAST) values of key-changing updates from the old key's row.

        A row whose old key is not in the target is dropped: PostgreSQL skips
        such an update (update_missing).
        """
        from delta.tables import DeltaTable
        from pyspark.sql import functions as fn

        old = DeltaTable.forPath(session, path).toDF()
        old = old.select(
            *[fn.col(quote(c.name)).alias(f"__pgsub_old_{i}") for i, c in enumerate(schema.columns)]
        )
        names = [c.name for c in schema.columns]
        on = [
            frame[quote(from_key(p))] == old[f"__pgsub_old_{names.index(k)}"]
            for p, k in enumerate(schema.key)
        ]
        joined = frame.join(old, reduce(lambda a, b: a & b, on), "left")
        moved = fn.col(quote(from_key(0))).isNotNull()
        found = fn.col(f"__pgsub_old_{names.index(schema.key[0])}").isNotNull()
        joined = joined.where(~moved | found)
        for index in keep_columns:
            flag = fn.col(keep_flag(index))
            value = fn.col(quote(names[index]))
            joined = joined.withColumn(
                names[index], fn.when(moved & flag, fn.col(f"__pgsub_old_{index}")).otherwise(value)
            ).withColumn(keep_flag(index), flag & ~moved)
        return joined.select(*[quote(n) for n in frame.columns])

    def _merge(
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
            self._committed_version(session),
            inserted=int(counts.get("num_inserted_rows") or 0),
            updated=int(counts.get("num_updated_rows") or 0),
            deleted=int(counts.get("num_deleted_rows") or 0),
        )

    def _overwrite(self, schema: TargetSchema, rows: pa.Table, mark: CommitMark) -> WriteResult:
        with self._marked(mark) as session:
            frame = self._frame(session, rows, schema)
            frame.write.format("delta").mode("overwrite").save(self.path(schema.table))
            return WriteResult(
                schema.table, self._committed_version(session), inserted=rows.num_rows
            )

    def copy_into(
        self, schema: TargetSchema, blocks: Iterator[pa.Table], mark: CommitMark
    ) -> tuple[int, int | None]:
        """Replace the table's rows with ``blocks`` (the initial copy); (rows, version).

        With a local Spark the blocks are staged as Parquet files (written by
        pyarrow, one block in memory at a time) and land in one Delta commit
        carrying ``mark``: the copy is atomic, and no block travels inside a
        Spark task. Elsewhere (a cluster cannot read our local disk) each
        block is its own commit: the first overwrites whatever a failed
        attempt left, and only the last carries ``mark``.
        """
        path = self.path(schema.table)
        try:
            if self._local_master():
                return self._copy_staged(schema, blocks, mark, path)
            return self._copy_by_block(schema, blocks, mark, path)
        except SparkErrors as exc:
            raise TargetTableError(f"copying {schema.table} into {path} failed: {exc}") from exc

    def _local_master(self) -> bool:
        try:
            return str(self._spark.conf.get("spark.master", "")).startswith("local")
        except SparkErrors:
            return False

    def _copy_staged(
        self, schema: TargetSchema, blocks: Iterator[pa.Table], mark: CommitMark, path: str
    ) -> tuple[int, int | None]:
        import pyarrow.parquet as pq

        staging = Path(tempfile.mkdtemp(prefix="pgsub-copy-"))
        try:
            rows = 0
            for number, block in enumerate(blocks):
                pq.write_table(block, staging / f"part-{number:06d}.parquet")
                rows += block.num_rows
            with self._marked(mark) as session:
                if rows:
                    frame = session.read.schema(_struct(schema.ddl())).parquet(str(staging))
                else:
                    frame = self._frame(session, source_empty(schema), schema)
                frame.write.format("delta").mode("overwrite").save(path)
                return rows, self._committed_version(session)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _copy_by_block(
        self, schema: TargetSchema, blocks: Iterator[pa.Table], mark: CommitMark, path: str
    ) -> tuple[int, int | None]:
        rows = 0
        mode = "overwrite"
        ahead = next(blocks, None)
        while True:
            block = ahead if ahead is not None else source_empty(schema)
            ahead = next(blocks, None)
            last = ahead is None
            with self._marked(mark) if last else self._noted(mark) as session:
                self._frame(session, block, schema).write.format("delta").mode(mode).save(path)
                version = self._committed_version(session) if last else None
            rows += block.num_rows
            mode = "append"
            if last:
                return rows, version

    def _write_multiset(
        self,
        schema: TargetSchema,
        net: MultisetNet,
        mark: CommitMark,
        path: str,
        resolutions: Mapping[ConflictKind, Resolution],
    ) -> WriteResult:
        source = multiset_source(net, schema)
        if net.truncated:
            return self._overwrite(schema, source.inserts, mark)
        if source.removals.num_rows == 0:
            with self._marked(mark) as session:
                frame = self._frame(session, source.inserts, schema)
                frame.write.format("delta").mode("append").save(path)
                return WriteResult(
                    schema.table, self._committed_version(session), inserted=source.inserts.num_rows
                )
        names = [c.name for c in schema.columns]
        values = source.inserts.select(names).schema
        remaining, short = self._remaining_copies(schema, source.removals, path)
        missing = tuple(
            Finding("delete_missing", row.first_tx, (), row.image, None)
            for index, row in enumerate(source.removed)
            if index in short
        )
        if missing and resolutions[ConflictKind.DELETE_MISSING] is Resolution.ERROR:
            raise ConflictError(ConflictKind.DELETE_MISSING.value, schema.table, list(missing))
        copies = [i for i, n in enumerate(remaining[COUNT].to_pylist()) for _ in range(n)]
        reinserts = remaining.take(pa.array(copies, type=pa.int64())).select(names).cast(values)
        markers = source.removals.select(names)
        # Typed flags: an untyped empty list is Arrow's null type, which concat refuses.
        markers = markers.append_column(REMOVE, _flags(True, markers.num_rows))
        adds = pa.concat_tables([reinserts, source.inserts.select(names)])
        adds = adds.append_column(REMOVE, _flags(False, adds.num_rows))
        with self._marked(mark) as session:
            frame = self._frame(session, pa.concat_tables([markers, adds]), schema)
            result = self._merge(session, schema, frame, multiset_merge(schema), path)
        return WriteResult(
            schema.table,
            result.version,
            inserted=result.inserted - reinserts.num_rows,
            deleted=result.deleted - reinserts.num_rows,
            conflicts=missing,
        )

    def _remaining_copies(
        self, schema: TargetSchema, removals: pa.Table, path: str
    ) -> tuple[pa.Table, set[int]]:
        """Each row to remove from, with how many copies stay (the target's count minus COUNT).

        Fewer copies in the target than the batch removes is delete_missing.
        """
        from delta.tables import DeltaTable
        from pyspark.sql import functions as fn

        session = self._session()
        names = [c.name for c in schema.columns]
        target = DeltaTable.forPath(session, path).toDF().select(*[quote(n) for n in names])
        target = target.withColumn("__pgsub_hit", fn.lit(1))
        wanted = self._frame(session, removals, schema)
        same = reduce(
            lambda a, b: a & b, [wanted[quote(n)].eqNullSafe(target[quote(n)]) for n in names]
        )
        counted = (
            wanted.join(target, same, "left")
            .groupBy(*[wanted[quote(n)] for n in names], wanted[quote(COUNT)], wanted[ROW])
            .agg(fn.sum(fn.coalesce(target["__pgsub_hit"], fn.lit(0))).alias("__pgsub_existing"))
            .toArrow()
        )
        stay = pc.subtract(counted["__pgsub_existing"], counted[COUNT])
        short = {
            int(row)
            for row, left in zip(counted[ROW].to_pylist(), stay.to_pylist(), strict=True)
            if left < 0
        }
        table: pa.Table = counted.drop_columns(["__pgsub_existing", COUNT, ROW])
        return table.append_column(COUNT, pc.max_element_wise(stay, 0)), short

    def _conflict(self, schema: TargetSchema, net: KeyedNet, kind: str, path: str) -> ConflictError:
        """The MERGE raised: find every conflicting chain, against the unchanged table."""
        findings = find_keyed(self._session(), schema, net, self._table_frame(path, None))
        return ConflictError(kind, schema.table, findings)


def _struct(ddl: str) -> StructType:
    from pyspark.sql.types import StructType

    return cast("StructType", StructType.fromDDL(ddl))


def _helper_type(name: str) -> str:
    if name.startswith("__pgsub_keep_") or name == REMOVE:
        return "boolean"
    if name == COUNT:
        return "long"
    if name == ROW:
        return "int"
    raise KeyError(name)


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _flags(value: bool, count: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, type=pa.bool_()), count)
