"""What a Delta checkpoint holds, and what the commits since the last one changed.

``SCHEMA`` is delta-rs 1.x's checkpoint schema, field for field (a classic single-file
checkpoint, which Spark, delta-rs and pgsub's own log replay read). ``LogSince`` takes
commits' actions in order and keeps what a checkpoint needs of them - the files added and
removed, the tombstones, the idempotent-write ids, protocol, metadata and domains - or says
it did not follow them: an action or a field the schema has no place for (it would be lost),
partition values, a commit skipped. ``apply.delta.writer.checkpoint`` applies it to the last
checkpoint's rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import pyarrow as pa

_STRINGS: Final = pa.map_(pa.field("key", pa.string(), nullable=False), pa.string())
_OPTIONS: Final = pa.map_(
    pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)
)
_NAMES: Final = pa.list_(pa.field("element", pa.string(), nullable=False))
_VECTOR: Final = pa.struct(
    [
        pa.field("storageType", pa.string(), nullable=False),
        pa.field("pathOrInlineDv", pa.string(), nullable=False),
        pa.field("offset", pa.int32()),
        pa.field("sizeInBytes", pa.int32(), nullable=False),
        pa.field("cardinality", pa.int64(), nullable=False),
    ]
)
# delta-rs 1.x's checkpoint schema (``pq.read_schema`` of one it wrote), field for field.
SCHEMA: Final = pa.schema(
    [
        pa.field(
            "add",
            pa.struct(
                [
                    pa.field("path", pa.string(), nullable=False),
                    pa.field("partitionValues", _STRINGS, nullable=False),
                    pa.field("size", pa.int64(), nullable=False),
                    pa.field("modificationTime", pa.int64(), nullable=False),
                    pa.field("dataChange", pa.bool_(), nullable=False),
                    pa.field("stats", pa.string()),
                    pa.field("tags", _STRINGS),
                    pa.field("deletionVector", _VECTOR),
                    pa.field("baseRowId", pa.int64()),
                    pa.field("defaultRowCommitVersion", pa.int64()),
                    pa.field("clusteringProvider", pa.string()),
                ]
            ),
        ),
        pa.field(
            "remove",
            pa.struct(
                [
                    pa.field("path", pa.string(), nullable=False),
                    pa.field("deletionTimestamp", pa.int64()),
                    pa.field("dataChange", pa.bool_(), nullable=False),
                    pa.field("extendedFileMetadata", pa.bool_()),
                    pa.field("partitionValues", _STRINGS),
                    pa.field("size", pa.int64()),
                    pa.field("stats", pa.string()),
                    pa.field("tags", _STRINGS),
                    pa.field("deletionVector", _VECTOR),
                    pa.field("baseRowId", pa.int64()),
                    pa.field("defaultRowCommitVersion", pa.int64()),
                ]
            ),
        ),
        pa.field(
            "metaData",
            pa.struct(
                [
                    pa.field("id", pa.string(), nullable=False),
                    pa.field("name", pa.string()),
                    pa.field("description", pa.string()),
                    pa.field(
                        "format",
                        pa.struct(
                            [
                                pa.field("provider", pa.string(), nullable=False),
                                pa.field("options", _OPTIONS, nullable=False),
                            ]
                        ),
                        nullable=False,
                    ),
                    pa.field("schemaString", pa.string(), nullable=False),
                    pa.field("partitionColumns", _NAMES, nullable=False),
                    pa.field("createdTime", pa.int64()),
                    pa.field("configuration", _OPTIONS, nullable=False),
                ]
            ),
        ),
        pa.field(
            "protocol",
            pa.struct(
                [
                    pa.field("minReaderVersion", pa.int32(), nullable=False),
                    pa.field("minWriterVersion", pa.int32(), nullable=False),
                    pa.field("readerFeatures", _NAMES),
                    pa.field("writerFeatures", _NAMES),
                ]
            ),
        ),
        pa.field(
            "txn",
            pa.struct(
                [
                    pa.field("appId", pa.string(), nullable=False),
                    pa.field("version", pa.int64(), nullable=False),
                    pa.field("lastUpdated", pa.int64()),
                ]
            ),
        ),
        pa.field(
            "domainMetadata",
            pa.struct(
                [
                    pa.field("domain", pa.string(), nullable=False),
                    pa.field("configuration", pa.string(), nullable=False),
                    pa.field("removed", pa.bool_(), nullable=False),
                ]
            ),
        ),
        pa.field(
            "sidecar",
            pa.struct(
                [
                    pa.field("path", pa.string(), nullable=False),
                    pa.field("sizeInBytes", pa.int64(), nullable=False),
                    pa.field("modificationTime", pa.int64(), nullable=False),
                    pa.field("tags", _STRINGS),
                ]
            ),
        ),
    ]
)
# What a commit holds that a checkpoint does not.
_NOT_KEPT: Final = frozenset({"commitInfo", "cdc"})
# The fields each kind of action may have here: a field the schema has no place for would be
# lost, so a commit with one leaves the checkpoint to delta-rs.
_FIELDS: Final = {
    kind: frozenset(
        SCHEMA.field(kind).type.field(i).name for i in range(SCHEMA.field(kind).type.num_fields)
    )
    for kind in ("add", "remove", "metaData", "protocol", "txn", "domainMetadata")
}


def file_key(path: str, vector: Mapping[str, Any] | None) -> str:
    """What tells a live file apart in the log: its path as spelled and its deletion
    vector (Delta's protocol), as one string - the same one ``_file_keys`` makes in Arrow."""
    if not vector:
        return f"{path}\0\0\0"
    offset = vector.get("offset")
    return "\0".join(
        [
            path,
            str(vector.get("storageType", "")),
            str(vector.get("pathOrInlineDv", "")),
            "" if offset is None else str(offset),
        ]
    )


class LogSince:
    """What the commits after checkpoint ``base`` (-1: none, the log from its first commit)
    through ``version`` changed, as the actions a checkpoint holds.

    A file's ``add`` or ``remove`` is kept as its JSON text (``bodies`` reads them back),
    not as the dict: an open table keeps up to one checkpoint interval of them (100
    commits), and a small table rewritten whole removes a file a commit - a remove's dict
    is about 900 bytes, its text 240; in the daemon, about 0.7 KB an action as dicts and
    0.4 as text (docs/performance.md, "Where the climb goes")."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.version = base
        self.followed = True  # False: an action this does not follow (delta-rs checkpoints)
        self.protocol: dict[str, Any] | None = None
        self.metadata: dict[str, Any] | None = None
        self.txns: dict[str, dict[str, Any]] = {}
        self.domains: dict[str, dict[str, Any]] = {}
        self.adds: dict[str, str] = {}  # by file key: the action's body, as JSON text
        self.removes: dict[str, str] = {}
        self.gone: set[str] = set()  # the base checkpoint's live files removed since

    def take(self, version: int, actions: list[dict[str, Any]]) -> None:
        """Commit ``version``'s ``actions``, which follows the one taken last."""
        if version != self.version + 1:
            self.followed = False
        self.version = version
        for action in actions:
            if len(action) != 1:
                self.followed = False
                continue
            ((kind, body),) = action.items()
            if kind in _NOT_KEPT:
                continue
            if (
                kind not in _FIELDS
                or not isinstance(body, dict)
                or not body.keys() <= _FIELDS[kind]
            ):
                self.followed = False
                continue
            self._take(kind, body)

    def _take(self, kind: str, body: dict[str, Any]) -> None:
        if kind in ("add", "remove") and body.get("partitionValues"):
            self.followed = False  # the partition values' types are the schema's to say
        if kind == "add":
            key = file_key(str(body["path"]), body.get("deletionVector"))
            self.adds[key] = _text(body)
            self.removes.pop(key, None)
        elif kind == "remove":
            key = file_key(str(body["path"]), body.get("deletionVector"))
            if self.adds.pop(key, None) is None:
                self.gone.add(key)  # live in the base checkpoint, or this is not followed
            self.removes[key] = _text(body)
        elif kind == "txn":
            self.txns[str(body["appId"])] = body
        elif kind == "domainMetadata":
            self.domains[str(body["domain"])] = body
        elif kind == "protocol":
            self.protocol = body
        else:
            self.metadata = body


def bodies(texts: dict[str, str]) -> list[dict[str, Any]]:
    """``LogSince.adds`` or ``removes``: each action's body as a dict again."""
    return [json.loads(text) for text in texts.values()]


def _text(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))
