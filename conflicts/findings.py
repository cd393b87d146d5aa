"""A conflicting chain of changes, as the writer found it: what a conflict report is made of.

Pure. The Delta writer looks a batch's keys up only when the MERGE says
something conflicted (``apply.delta.spark.findings``); each conflicting chain
becomes a ``Finding``: the remote row, the existing local row as text and
the transaction, which ``apply.worker.applier`` turns into a ``conflicts.report.Conflict``.
"""

from __future__ import annotations

from dataclasses import dataclass

from subscriber.replication.messages import TupleData


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # a conflicts.kinds.ConflictKind value
    tx_index: int  # the first change's transaction in the batch
    key: tuple[bytes | None, ...]  # the key's values as they arrived
    image: TupleData | None  # the remote row: the chain's last image, None when deleted
    existing: dict[str, str | None] | None  # the local row, as text
    local_version: int | None = None  # the Delta version that last changed the local row
    resolution: str | None = None  # the action taken, when it is not the configured one
    key_kinds: bytes | None = None  # the key values' formats (TEXT or BINARY), when not text
