"""When the receive side of a stream reports, pings and gives up: pure, no socket.

PostgreSQL's walreceiver (and its logical apply worker) sends a standby
status update at least every ``wal_receiver_status_interval``, at once when
a keepalive asks for a reply, pings the server once half of
``wal_receiver_timeout`` passed in silence, and ends the connection when the
whole timeout passed. pgsub adds one rule: a status update that would only
move ``write`` waits up to ``WRITE_REPORT_DELAY``, so a reader faster than
the walsender does not reply at each drain of the socket.

``StreamPolicy`` holds those rules and the times they depend on; the
stream (``subscriber.replication.stream``) asks it what to do and tells it
what happened. Every decision takes ``now`` (monotonic seconds), so the
rules are tested with numbers, without a server.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from subscriber.replication.progress import Feedback

# A status update that only moves `write` waits at most this long (seconds).
WRITE_REPORT_DELAY = 0.1


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """A subscription's two walreceiver settings, as PostgreSQL names them."""

    status_interval: float = 10.0  # wal_receiver_status_interval
    wal_receiver_timeout: float = 60.0


DEFAULT_TIMING = StreamTiming()


class Silence(enum.Enum):
    """What the server's silence calls for."""

    WAIT = "wait"
    PING = "ping"  # a status update asking for a reply, once per silence
    GIVE_UP = "give up"  # wal_receiver_timeout passed: the connection is lost


@dataclass(slots=True)
class StreamPolicy:
    status_interval: float
    timeout: float  # wal_receiver_timeout
    last_receipt: float
    last_status: float
    pinged: bool = False
    last_sent: Feedback | None = None
    write_pending: bool = False  # a moved `write` not reported yet

    @classmethod
    def starting(cls, now: float, *, status_interval: float, timeout: float) -> StreamPolicy:
        return cls(status_interval, timeout, last_receipt=now, last_status=now)

    def received(self, now: float) -> None:
        """A frame arrived (keepalives count): the silence ends."""
        self.last_receipt = now
        self.pinged = False

    held = received  # backpressure: nothing is read, so the pause is not the server's silence

    def should_report(self, feedback: Feedback, now: float, *, force: bool = False) -> bool:
        """Whether a status update with ``feedback`` goes out now."""
        since = now - self.last_status
        if force or since >= self.status_interval:
            return True
        last = self.last_sent
        if feedback == last:
            return False
        if (
            last is not None
            and (feedback.flush, feedback.apply) == (last.flush, last.apply)
            and since < WRITE_REPORT_DELAY
        ):
            self.write_pending = True  # only `write` moved: it goes out by the delay
            return False
        return True

    def reported(self, feedback: Feedback, now: float) -> None:
        self.last_status = now
        self.last_sent = feedback
        self.write_pending = False

    def silence(self, now: float) -> Silence:
        """What the time since the last frame calls for; a PING is answered once."""
        silent = now - self.last_receipt
        if silent >= self.timeout:
            return Silence.GIVE_UP
        if silent >= self.timeout / 2 and not self.pinged:
            self.pinged = True
            return Silence.PING
        return Silence.WAIT

    def silent_for(self, now: float) -> float:
        return now - self.last_receipt

    def wake_at(self) -> float:
        """When the next decision falls due: a status update, a ping or the timeout."""
        report = self.last_status + (
            WRITE_REPORT_DELAY if self.write_pending else self.status_interval
        )
        silence = self.last_receipt + (self.timeout if self.pinged else self.timeout / 2)
        return min(report, silence)
