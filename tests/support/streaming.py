"""Reading a real replication stream in tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from subscriber.replication.commands import Streaming, StreamOptions
from subscriber.replication.lsn import Lsn
from subscriber.replication.messages import Message
from subscriber.replication.pgoutput import PgOutputDecoder
from subscriber.replication.progress import Progress
from subscriber.replication.runs import Decoded, WholeTransaction
from subscriber.replication.stream import ReplicationConnection
from subscriber.replication.tuples import RowChanges
from tests.support.pgdatabase import PgDatabase


def read_stream(
    db: PgDatabase,
    slot: str,
    options: StreamOptions,
    until: Callable[[Sequence[Message]], bool],
    timeout: float = 60.0,
    raw: list[tuple[bytes, Lsn]] | None = None,
) -> list[Message]:
    """Stream from ``slot`` until ``until(messages)``; the raw payloads go to ``raw``."""
    progress = Progress()
    connection = ReplicationConnection(db.replication_dsn)
    decoder = PgOutputDecoder(
        options.negotiated_proto(connection.server_version),
        parallel_streaming=options.streaming is Streaming.PARALLEL,
    )
    stream = connection.start_replication(slot, Lsn(0), options, progress, status_interval=1)
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while not until(messages):
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [type(m).__name__ for m in messages[-20:]]
                raise AssertionError(f"stream did not reach the expected point; last: {kinds}")
            data = stream.read(timeout=left)
            if data is None:
                continue
            if raw is not None:
                raw.append((data.payload, data.data_start))
            messages.append(decoder.decode(data.payload, data.data_start))
    finally:
        stream.stop()
    return messages


def create_slot(db: PgDatabase, slot: str, **kwargs: bool) -> Lsn:
    with ReplicationConnection(db.replication_dsn) as connection:
        return connection.create_slot(slot, **kwargs).consistent_point  # type: ignore[arg-type]


def as_messages(decoded: Sequence[Decoded]) -> list[Message]:
    """What a run decoder handed on, as the messages it was, in stream order."""
    out: list[Message] = []
    for item in decoded:
        if isinstance(item, RowChanges | WholeTransaction):
            out.extend(item.messages())
        else:
            out.append(item)
    return out
