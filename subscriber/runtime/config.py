"""The daemon's configuration: its keys, their defaults and their validation.

Read from a YAML file with environment overrides by ``subscriber.runtime.config_file``.

The keys are a contract (docs/architecture.md). Unknown keys are errors (a
typo must not silently fall back to a default). Every key can be overridden from the
environment as ``PGSUB_<PATH>``: ``PGSUB_WAREHOUSE``, ``PGSUB_SPARK_MASTER``,
``PGSUB_SUBSCRIPTIONS_0_CONNECTION`` (by position) or
``PGSUB_SUBSCRIPTIONS_SUB1_CONNECTION`` (by name); values are read as YAML
(``true``, ``5``, ``[a, b]``). Secrets come from the environment (libpq's
``PGPASSWORD``, ``PGPASSFILE``) or from files (``password_file``), and the
connection string is never logged.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from apply.core.batch import GROWTH
from apply.core.features import DELETION_VECTORS_ABOVE, REWRITE_FACTOR, FeatureMode, TableFeatures
from apply.core.maintenance_policy import MaintenancePolicy
from apply.core.transactions import Bounds
from apply.delta.files.storage import Storage, is_object_store, register
from apply.history.changelog import History, HistoryMode
from conflicts.kinds import ConflictKind, Resolution
from subscriber.replication.commands import Streaming, check_slot_name
from tablesync.copy import CopySettings
from tablesync.settings import SyncSettings

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
# PostgreSQL's memory units: kB, MB, GB and TB are multiples of 1024 (KiB, MiB, ... too).
_SIZE_UNITS = {None: 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""


def _seconds(value: Any) -> Any:
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 1s, 5m)")
        return float(match.group(1)) * _UNITS[match.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(_seconds), Field(ge=0)]


def _bytes(value: Any) -> Any:
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match is None:
            raise ValueError(f"not a size: {value!r} (use e.g. 64MB, 1GB, 65536)")
        unit = match.group(2)
        return int(match.group(1)) * _SIZE_UNITS[unit[0].lower() if unit else None]
    return value


ByteSize = Annotated[int, BeforeValidator(_bytes), Field(ge=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchConfig(_Strict):
    max_changes: int = Field(100_000, ge=1)
    # Row data (values' bytes) in a batch; a transaction past it is spooled to disk and
    # applied in pieces. The receive queue holds up to twice these bounds.
    max_bytes: ByteSize = 64 * 1024**2
    max_delay: Duration = 1.0
    # A batch holding this many changes is written as soon as the writer is free, not at
    # max_delay (group commit); fewer wait max_delay. 0: every batch waits max_delay.
    min_changes: int = Field(1000, ge=0)

    def bounds(self) -> Bounds:
        return Bounds(self.max_changes, self.max_bytes)

    def queue_bounds(self) -> Bounds:
        """What the queue from the receiver to the apply worker holds at most: as much as a
        batch grown while the target lags (``apply.core.batch.GROWTH``) takes from it."""
        return Bounds(max(GROWTH * self.max_changes, 10_000), 2 * self.max_bytes)


class ConflictsConfig(_Strict):
    insert_exists: Resolution = Resolution.ERROR
    update_exists: Resolution = Resolution.ERROR
    update_missing: Resolution = Resolution.SKIP
    delete_missing: Resolution = Resolution.SKIP
    update_origin_differs: Resolution = Resolution.APPLY_REMOTE
    delete_origin_differs: Resolution = Resolution.APPLY_REMOTE

    def resolutions(self) -> dict[ConflictKind, Resolution]:
        return {kind: getattr(self, kind.value) for kind in ConflictKind}


class TableFeaturesConfig(_Strict):
    """Delta reader features of the target tables (docs/tables.md): each auto|always|never."""

    column_mapping: FeatureMode = FeatureMode.AUTO  # auto: when a column name needs it
    type_widening: FeatureMode = FeatureMode.AUTO  # auto: when a column's type first widens
    # auto: once a batch would rewrite more than rewrite_factor times what it writes with
    # them, or the table holds more than deletion_vectors_above of Parquet (its batches then
    # write the changed rows, not every touched file); true/false as always/never.
    deletion_vectors: FeatureMode = FeatureMode.AUTO
    deletion_vectors_above: ByteSize = DELETION_VECTORS_ABOVE
    rewrite_factor: float = Field(default=REWRITE_FACTOR, gt=1)
    # true: every commit also records its row-level changes (Delta's change data feed, a
    # writer feature: readers without it still read the table); every write then by Spark.
    change_data_feed: bool = False

    @field_validator("deletion_vectors", mode="before")
    @classmethod
    def _deletion_vectors(cls, value: object) -> object:
        if isinstance(value, bool):  # the key's earlier form
            return FeatureMode.ALWAYS if value else FeatureMode.NEVER
        return value

    def features(self) -> TableFeatures:
        return TableFeatures(
            self.column_mapping,
            self.type_widening,
            self.deletion_vectors,
            int(self.deletion_vectors_above),
            self.change_data_feed,
            self.rewrite_factor,
        )


class HistoryConfig(_Strict):
    """How the target tables keep what the publisher did (docs/tables.md, "History"): each
    table as ``mode`` says, but those named in ``tables`` (schema.name -> mode). mirror: each
    key's last image, as PostgreSQL's subscriber; soft_delete: a mirror whose deleted rows
    stay, marked; changelog: every change a row, appended; scd2: a row per version of each
    key, valid from / to."""

    mode: HistoryMode = HistoryMode.MIRROR
    tables: dict[str, HistoryMode] = Field(default_factory=dict)
    # true: a mirror's rows carry _pgsub_lsn and _pgsub_commit_time of their last write
    metadata_columns: bool = False

    def history(self) -> History:
        return History(self.mode, dict(self.tables), self.metadata_columns)


class HeartbeatConfig(_Strict):
    """A statement run on the publisher every ``interval`` (0: never), for a slot that
    keepalives cannot move on: a database whose own tables stay quiet while others write
    (Debezium's ``heartbeat.action.query``). Its WAL reaches the slot, which pgsub then
    confirms. The default writes a non-transactional logical message (no table needed;
    pgsub ignores it unless ``messages: true``)."""

    interval: Duration = 0.0
    statement: str = "SELECT pg_catalog.pg_logical_emit_message(false, 'pgsub-heartbeat', '')"


class CopyConfig(_Strict):
    """How the initial copy reads a table (docs/tablesync.md, "Ranges")."""

    # CTID ranges a table is read in, each under the sync slot's snapshot: auto (one per
    # range_size of the table's heap) or a number.
    ranges: Literal["auto"] | int = Field("auto")
    range_size: ByteSize = 64 * 1024**2
    # Ranges read at once by the daemon's threads on a local Spark (1: one COPY in the sync
    # slot's own transaction, as PostgreSQL; measured faster on 2 cores shared with the
    # publisher, docs/performance.md); a cluster reads the ranges as Spark tasks.
    readers: int = Field(1, ge=1, le=64)
    # A keyed table read in ranges is staged range by range, so that a crash of the daemon
    # keeps what was read (docs/tablesync.md, "Resuming a copy"); false: written once, and
    # copied again after a crash, as PostgreSQL does.
    resumable: bool = True
    # On the first start, every table of at most range_size is copied under the
    # subscription slot's own snapshot before the leader streams: no sync slot, catch-up
    # or handover per table (docs/tablesync.md, "The first start"); false: each table on
    # its own, as PostgreSQL.
    initial_load: bool = True

    @field_validator("ranges")
    @classmethod
    def _positive(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if value != "auto" and value < 1:
            raise ValueError("ranges must be auto or at least 1")
        return value

    def settings(self) -> CopySettings:
        ranges = None if self.ranges == "auto" else int(self.ranges)
        return CopySettings(ranges, int(self.range_size), self.readers, self.resumable)


class SubscriptionConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    connection: str
    password_file: Path | None = None
    publications: list[str] = Field(min_length=1)
    slot_name: str | None = None
    create_slot: bool = True
    copy_data: bool = True
    enabled: bool = True
    binary: bool = False
    # Logical decoding messages (pg_logical_emit_message) into a Delta table, in commit order
    # with their transaction: messages_path, default <warehouse>/_pgsub/messages.
    messages: bool = False
    messages_path: str | None = None
    # Follow the schema changes that `pgsub publisher-setup`'s event triggers announce, at
    # their LSN (docs/tables.md, "Schema changes"): asks a PostgreSQL 14+ publisher for its
    # logical messages, and keeps only those unless `messages` is on.
    schema_changes: bool = True
    streaming: Streaming = Streaming.OFF
    two_phase: bool = False
    origin: Literal["any", "none"] = "any"
    disable_on_error: bool = False
    failover: bool = False
    max_sync_workers: int = Field(2, ge=1, le=64)
    # `copy:` in the file (the attribute's name would hide BaseModel.copy).
    initial_copy: CopyConfig = Field(default_factory=CopyConfig, alias="copy")
    create_tables: bool = True
    # Create target tables with Delta row tracking, so that *_origin_differs is detected.
    # Off by default, as PostgreSQL's track_commit_timestamp: it costs MERGE time.
    track_origin: bool = False
    # True: target tables may also be written by other subscriptions (several publishers
    # feeding one table on purpose); otherwise such a table stops the apply with an error.
    shared_tables: bool = False
    table_features: TableFeaturesConfig = Field(default_factory=TableFeaturesConfig)
    history: HistoryConfig = Field(default_factory=HistoryConfig)
    batch: BatchConfig = Field(default_factory=BatchConfig)
    # Keyed batches of a local warehouse's tables merged in this many processes of their own,
    # each table always by the same one (0: by the apply process's threads). Many small
    # tables' lag p99 shorter on two cores (1,000 tables at 500/s: 1.40-1.86 s against
    # 3.16-4.39 s), for about 200 MB; at 200 tables a tenth shorter at 1,000/s but behind at
    # 8,000/s where the threads keep up. auto: two when the subscription has 1,000 tables or
    # more and the daemon may use two cores (its cgroup's quota), else none; chosen as it
    # starts (docs/apply.md, "Writer processes").
    writer_processes: Annotated[int, Field(ge=0, le=16)] | Literal["auto"] = "auto"
    # Local scratch for streamed transactions, those larger than a batch and the staged
    # initial copy (default: <system temp>/pgsub-<uid>/<name>-<warehouse digest>, mode 700);
    # emptied at start, as the publisher resends what it held.
    spool_dir: Path | None = None
    conflicts: ConflictsConfig = Field(default_factory=ConflictsConfig)
    wal_retrieve_retry_interval: Duration = 5.0
    # Failed attempts in a row wait twice as long each time, up to this.
    max_retry_interval: Duration = 300.0
    # A batch still being written after this long fails /healthz (a hung MERGE).
    apply_timeout: Duration = 1800.0
    wal_receiver_timeout: Duration = 60.0
    # How often the leader appends a row to _pgsub/checkpoints (every table's Delta version at
    # one LSN, for readers who want a consistent cross-table point); not every batch. A row
    # is recorded at a batch that takes nothing ahead (docs/apply.md), whose next changes
    # wait up to one batch longer: once a minute, as Kafka Connect flushes its offsets.
    checkpoint_interval: Duration = 60.0
    status_interval: Duration = 10.0
    heartbeat: HeartbeatConfig = Field(default_factory=HeartbeatConfig)

    @field_validator("streaming", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        # YAML reads an unquoted off/on as a boolean.
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    @field_validator("connection")
    @classmethod
    def _conninfo(cls, value: str) -> str:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(value)
        except ProgrammingError:
            # libpq's message may quote part of the string, and with it a password.
            raise ValueError(
                "not a valid libpq connection string: use key=value pairs "
                "(host=db dbname=app user=replicator) or a postgresql:// URI"
            ) from None
        return value

    @field_validator("password_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                value.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {value}: {exc.strerror}") from None
        return value

    @model_validator(mode="after")
    def _supported(self) -> SubscriptionConfig:
        check_slot_name(self.slot)
        return self

    def sync_settings(self) -> SyncSettings:
        return SyncSettings(
            self.name,
            self.copy_data,
            self.max_sync_workers,
            self.wal_retrieve_retry_interval,
            self.max_retry_interval,
        )

    def spool_path(self, warehouse: str) -> Path:
        """``spool_dir``, or a folder per user (as tmux's: another local user cannot make it
        first), per subscription and per warehouse: two daemons on one host whose
        subscriptions share a name do not share a spool."""
        if self.spool_dir is not None:
            return self.spool_dir
        where = warehouse if "://" in warehouse else os.path.abspath(warehouse)
        digest = hashlib.sha256(where.encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"pgsub-{os.getuid()}" / f"{self.name}-{digest}"

    @property
    def slot(self) -> str:
        return self.slot_name or self.name.lower()

    def conninfo(self) -> str:
        """The connection string, with the password from ``password_file`` when set."""
        if self.password_file is None:
            return self.connection
        from psycopg.conninfo import make_conninfo

        password = self.password_file.read_text().strip()
        return make_conninfo(self.connection, password=password)


class SparkConfig(_Strict):
    master: str = "local[*]"
    remote: str | None = None
    conf: dict[str, str] = Field(default_factory=dict)
    # on_demand: the session (a local JVM, or a cluster's driver) starts when a table first
    # needs Spark - never, for small tables; at_start: before replication, as a warm-up.
    start: Literal["on_demand", "at_start"] = "on_demand"
    # A warehouse folder with a cluster or a Spark Connect server: whether Spark sees it as
    # the daemon does (a shared file system), so the daemon copies and merges small tables
    # itself; auto: asked once, by a token file a Spark job reads back.
    sees_warehouse: Literal["auto"] | bool = "auto"

    def sees_warehouse_answer(self) -> bool | None:
        """``sees_warehouse`` as the tables take it: None to ask Spark (``auto``)."""
        return None if self.sees_warehouse == "auto" else bool(self.sees_warehouse)

    @field_validator("remote")
    @classmethod
    def _connect_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("sc://"):
            raise ValueError(
                "a Spark Connect server's URL starts with sc:// (sc://host:15002); "
                "for a local or cluster Spark set spark.master instead"
            )
        return value

    @field_validator("conf", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {
                str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()
            }
        return value


def _secret(inline: str | None, file: Path | None, environment: str) -> str | None:
    """A secret from its file, else from the environment variable ``environment``."""
    if file is not None:
        return file.read_text().strip() or None
    return os.environ.get(environment) or inline


class StorageConfig(_Strict):
    """How every engine reaches a warehouse in an object store (docs/operations.md,
    "Object storage"): the same facts to Spark (S3A), delta-rs and pgsub's own writer."""

    endpoint: str | None = None  # an S3-compatible server (http:// or https://); None: AWS
    region: str | None = None
    path_style: bool = False  # the bucket in the path, not the host name
    # Credentials: these files, else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
    # AWS_SESSION_TOKEN, else the cloud's chain (a web identity token: IRSA; an instance).
    access_key_id_file: Path | None = None
    secret_access_key_file: Path | None = None
    session_token_file: Path | None = None
    ca_file: Path | None = None  # the CA that signed the endpoint's certificate (pgsub's side)
    check: bool = True  # at start: the store refuses a second PUT of one name (If-None-Match)

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("an endpoint is a URL: http://host:port or https://host")
        return value.rstrip("/") if value else value

    @field_validator("access_key_id_file", "secret_access_key_file", "session_token_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                value.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {value}: {exc.strerror}") from None
        return value

    def storage(self) -> Storage:
        key = _secret(None, self.access_key_id_file, "AWS_ACCESS_KEY_ID")
        secret = _secret(None, self.secret_access_key_file, "AWS_SECRET_ACCESS_KEY")
        return Storage(
            endpoint=self.endpoint,
            region=self.region or os.environ.get("AWS_REGION") or None,
            path_style=self.path_style,
            access_key_id=key,
            secret_access_key=secret,
            session_token=_secret(None, self.session_token_file, "AWS_SESSION_TOKEN"),
            ca_file=None if self.ca_file is None else str(self.ca_file),
        )


class MetricsConfig(_Strict):
    host: str = "0.0.0.0"  # noqa: S104 - a pod's metrics port is scraped from outside
    port: int = Field(9187, ge=0, le=65535)


class MaintenanceConfig(_Strict):
    """Compaction, vacuum and history bounds of every table pgsub writes (docs/tables.md)."""

    enabled: bool = True
    interval: Duration = 300.0  # how often each table is looked at
    compact_files: int = Field(64, ge=2)  # OPTIMIZE a table holding more data files than this
    vacuum_interval: Duration = 86400.0
    # History kept: VACUUM retention, Delta log and idempotent-write ids, checkpoint rows.
    retention: Duration = 7 * 86400.0

    @model_validator(mode="after")
    def _positive(self) -> MaintenanceConfig:
        if self.interval <= 0 or self.retention < 3600:
            raise ValueError("interval must be positive and retention at least 1h")
        return self

    def policy(self) -> MaintenancePolicy:
        return MaintenancePolicy(self.compact_files, self.vacuum_interval, self.retention)


class LogConfig(_Strict):
    format: Literal["json", "console", "auto"] = "json"
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(_Strict):
    warehouse: str = "./warehouse"
    storage: StorageConfig = Field(default_factory=StorageConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    subscriptions: list[SubscriptionConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> Config:
        for what, values in (
            ("subscription names", [s.name for s in self.subscriptions]),
            ("slot names", [s.slot for s in self.subscriptions]),
        ):
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"{what} must be unique; repeated: {', '.join(repeated)}")
        return self

    def reach_warehouse(self) -> None:
        """Record how this process reaches the warehouse (``apply.delta.files.storage``): every
        table path under it finds the storage configuration."""
        if is_object_store(self.warehouse):
            register(self.warehouse, self.storage.storage())

    def spark_conf(self) -> dict[str, str]:
        """The Spark configuration: the storage's (S3A) for an object store warehouse, then
        the user's ``spark.conf``, which wins."""
        conf = self.storage.storage().spark_conf() if is_object_store(self.warehouse) else {}
        return {**conf, **self.spark.conf}

    def subscription(self, name: str) -> SubscriptionConfig:
        for sub in self.subscriptions:
            if sub.name == name:
                return sub
        known = ", ".join(s.name for s in self.subscriptions) or "none"
        raise ConfigError(f"no subscription named {name!r} in the config (known: {known})")
