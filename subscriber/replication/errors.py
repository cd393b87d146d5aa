"""The subscriber package's errors: each says what failed, where, and what to do."""

from __future__ import annotations

from subscriber.replication.lsn import Lsn


class SubscriberError(Exception):
    """Base of every error raised by the subscriber package."""


class ProtocolError(SubscriberError):
    """A replication message that does not follow the protocol.

    Names the message type, the byte offset where decoding failed and the
    WAL position of the message, so the message can be found again with
    ``pg_logical_slot_peek_binary_changes`` on the publisher.
    """

    def __init__(
        self,
        reason: str,
        *,
        msg_type: str | None = None,
        offset: int | None = None,
        lsn: Lsn | None = None,
    ) -> None:
        self.reason = reason
        self.msg_type = msg_type
        self.offset = offset
        self.lsn = lsn
        where = []
        if msg_type is not None:
            where.append(f"message {msg_type!r}")
        if offset is not None:
            where.append(f"offset {offset}")
        if lsn is not None:
            where.append(f"LSN {lsn}")
        super().__init__(f"protocol error: {reason}" + (f" ({', '.join(where)})" if where else ""))


class ReplicationError(SubscriberError):
    """The publisher refused a replication command or the stream failed."""


class ConnectionLostError(ReplicationError):
    """The replication connection broke or went silent; it can be re-established."""


class UnsupportedFeatureError(ReplicationError):
    """An option the publisher's server version does not offer."""


class UsageError(SubscriberError):
    """A command asked for something that does not exist (exit code 2, like a bad config)."""
