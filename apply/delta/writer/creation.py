"""A target table created without Spark: its first commit, pgsub's own or delta-rs's.

Where pgsub reaches the warehouse, a table that enables no table feature by
a property (``delta_rs_creates``) is created in milliseconds instead of a
cold JVM's seconds: by pgsub's own first commit when no column needs a
feature (``HeldCreation.commit``), by delta-rs when one does. The first
start's load holds that own commit back (``create_table``'s ``hold``) for
the table's copy to make with its rows: one commit, the table's version 0.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import pyarrow as pa

from apply.core.errors import CommitRacedError, TargetTableError
from apply.delta.files.local_store import LocalStore
from apply.delta.files.storage import delta_rs_options
from apply.delta.files.store import LOG, TableStore, table_store
from apply.delta.writer.local_tables import where
from apply.delta.writer.overwrite import ENGINE, commit

if TYPE_CHECKING:
    import deltalake

# The protocol of a table whose columns need no table feature, as delta-rs creates it.
_PLAIN_PROTOCOL: Final = {"minReaderVersion": 1, "minWriterVersion": 2}

# The table properties delta-rs sets at a table's creation as Spark does: no table feature
# among them (pgsub's own, not ``delta.*``, are kept as they are).
DELTA_RS_CREATES: Final = frozenset(
    {
        "delta.logRetentionDuration",
        "delta.deletedFileRetentionDuration",
        "delta.setTransactionRetentionDuration",
    }
)


def delta_rs_creates(properties: Mapping[str, str]) -> bool:
    """Whether delta-rs creates a table with ``properties`` as Spark would: they enable no
    table feature (column mapping, type widening, deletion vectors, row tracking)."""
    return all(not key.startswith("delta.") or key in DELTA_RS_CREATES for key in properties)


@dataclass(frozen=True, slots=True)
class HeldCreation:
    """A table's first commit held back (``create_table``'s ``hold``), to be made with the
    table's first rows: its protocol and metadata, for columns that need no table feature."""

    path: str
    columns: str  # Delta's schema, as JSON
    properties: Mapping[str, str]
    made_at: int  # milliseconds since the epoch

    def actions(self) -> list[dict[str, object]]:
        """The ``protocol`` and ``metaData`` of the table's version 0, as delta-rs writes
        them for columns that need no table feature (reader 1, writer 2)."""
        metadata: dict[str, object] = {
            "id": str(uuid.uuid4()),
            "name": None,
            "description": None,
            "format": {"provider": "parquet", "options": {}},
            "schemaString": self.columns,
            "partitionColumns": [],
            "createdTime": self.made_at,
            "configuration": dict(self.properties),
        }
        return [{"protocol": dict(_PLAIN_PROTOCOL)}, {"metaData": metadata}]

    def arrow(self) -> pa.Schema:
        """The table's columns as Arrow fields (``held_schema`` of the table once made)."""
        import deltalake

        return pa.schema(deltalake.Schema.from_json(self.columns).to_arrow())

    def appendable(self) -> bool:
        """Whether pgsub's own commit may add any rows to it (``overwrite.hand_appendable``
        with ``nullable``): not append-only, and every column may hold null."""
        if self.properties.get("delta.appendOnly", "false").lower() == "true":
            return False
        return all(field.get("nullable", True) for field in json.loads(self.columns)["fields"])

    def commit(self) -> bool:
        """The creation alone, as delta-rs writes it, committed by pgsub: whether it made it
        (False: there was one already, another's)."""
        made = self.actions()
        protocol, metadata = made[0]["protocol"], made[1]["metaData"]
        info = {
            "timestamp": self.made_at,
            "operation": "CREATE TABLE",
            "operationParameters": {
                "protocol": json.dumps(protocol, separators=(",", ":")),
                "metadata": json.dumps(metadata, separators=(",", ":")),
                "mode": "Ignore",
            },
            "engineInfo": ENGINE,
            "clientVersion": ENGINE,
        }
        store = self.make_room()
        try:
            commit(store, 0, [{"commitInfo": info}, *made])
        except CommitRacedError:
            return False  # made meanwhile (IF NOT EXISTS)
        except OSError as exc:
            raise TargetTableError(f"cannot create the Delta table at {self.path}: {exc}") from exc
        return True

    def make_room(self) -> TableStore:
        """The table's store; on a local disk, its folder and its log's made."""
        store = table_store(self.path)
        if isinstance(store, LocalStore):
            os.makedirs(os.path.join(store.folder, LOG), exist_ok=True)
        return store


@dataclass(frozen=True, slots=True)
class Created:
    """How ``create_table`` made a table: ``table``, delta-rs's opening of it after its
    creation (None: not opened); ``durable``, its first commit pgsub's own, durable already
    (delta-rs's is not fsynced); ``held``, its first commit not made yet (``hold``)."""

    table: deltalake.DeltaTable | None = None
    durable: bool = False
    held: HeldCreation | None = None


def create_table(
    path: str, schema: pa.Schema, properties: Mapping[str, str], *, hold: bool = False
) -> Created:
    """Create the table at ``path`` unless there is one (``CREATE TABLE IF NOT EXISTS``);
    a ``_delta_log`` without a commit (a creation cut short) is created over.

    pgsub's own first commit where the columns need no table feature (``_plain``): the
    protocol and the schema delta-rs writes, in one put-if-absent, durable when it returns;
    the caller opens the table when it needs it. delta-rs's creation read back the log it
    had just made three times (14 requests in a bucket, 9 ms a table on a local disk, the
    first start's load of 200 tables waiting on it). Else delta-rs's, with the table as
    it opened it after its creation. ``Created`` says which.

    ``hold``: that own first commit is not made but returned (``Created.held``), for the
    table's copy to make it with its rows - one commit, its version 0, where a creation
    then a copy made two, and the copy opened the table made by the first with delta-rs
    (the first start's load of 200 small tables: a third of its time)."""
    import deltalake

    columns = deltalake.Schema.from_arrow(schema).to_json()
    if _plain(columns):
        creation = HeldCreation(path, columns, dict(properties), int(time.time() * 1000))
        if hold:
            creation.make_room()
            return Created(held=creation)
        return Created(durable=creation.commit())
    try:
        made = deltalake.DeltaTable.create(
            where(path),
            schema=schema,
            storage_options=delta_rs_options(path),
            mode="ignore",
            configuration=dict(properties),
            # pgsub.* properties are not Delta's; delta-rs refuses unknown keys unless told.
            raise_if_key_not_exists=False,
        )
    except (deltalake.exceptions.DeltaError, OSError) as exc:
        raise TargetTableError(f"cannot create the Delta table at {path}: {exc}") from exc
    return Created(table=made)


def _plain(columns: str) -> bool:
    """Whether a table of ``columns`` (Delta's schema as JSON) needs no table feature: no
    ``timestamp_ntz`` (the ``timestampNtz`` feature) and no column metadata (invariants,
    generated or identity columns, column mapping). Either only sends the creation to
    delta-rs, which decides the protocol."""
    return "timestamp_ntz" not in columns and columns.count('"metadata":{}') == columns.count(
        '"metadata":'
    )
