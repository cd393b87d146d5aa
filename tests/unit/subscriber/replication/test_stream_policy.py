"""The stream's timing rules, with numbers for time: reports, pings, the timeout."""

from __future__ import annotations

from subscriber.replication.lsn import Lsn
from subscriber.replication.progress import Feedback
from subscriber.replication.stream_policy import WRITE_REPORT_DELAY, Silence, StreamPolicy


def feedback(write: int, flush: int = 0) -> Feedback:
    return Feedback(Lsn(write), Lsn(flush), Lsn(flush))


def policy(now: float = 0.0) -> StreamPolicy:
    return StreamPolicy.starting(now, status_interval=10.0, timeout=60.0)


def test_a_report_goes_out_when_positions_moved_and_at_least_every_interval() -> None:
    rules = policy()
    assert rules.should_report(feedback(1), 0.5)  # first report: nothing sent yet
    rules.reported(feedback(1), 0.5)
    assert not rules.should_report(feedback(1), 5.0)  # unchanged, interval not up
    assert rules.should_report(feedback(1), 10.5)  # the interval is up: unchanged too
    assert rules.should_report(feedback(1), 1.0, force=True)  # a keepalive asked


def test_a_moved_flush_goes_out_at_once_a_moved_write_within_the_delay() -> None:
    rules = policy()
    rules.reported(feedback(1), 0.0)
    assert rules.should_report(feedback(1, flush=1), 0.01)  # flush moved: at once
    rules.reported(feedback(1, flush=1), 0.01)
    assert not rules.should_report(feedback(5, flush=1), 0.02)  # only write moved
    assert rules.write_pending
    assert rules.wake_at() == 0.01 + WRITE_REPORT_DELAY  # woken to send it
    assert rules.should_report(feedback(5, flush=1), 0.01 + WRITE_REPORT_DELAY)
    rules.reported(feedback(5, flush=1), 0.2)
    assert not rules.write_pending and rules.wake_at() == 0.2 + 10.0


def test_silence_pings_once_at_half_the_timeout_then_gives_up_at_the_timeout() -> None:
    rules = policy()
    assert rules.silence(29.0) is Silence.WAIT
    assert rules.wake_at() == 10.0  # the status interval comes first
    rules.reported(feedback(0), 29.0)
    assert rules.wake_at() == 30.0  # then the ping
    assert rules.silence(30.0) is Silence.PING
    assert rules.silence(45.0) is Silence.WAIT  # pinged once per silence
    assert rules.wake_at() == 39.0  # the next status update, before the timeout at 60
    rules.reported(feedback(0), 55.0)
    assert rules.wake_at() == 60.0
    assert rules.silence(60.0) is Silence.GIVE_UP
    assert rules.silent_for(61.0) == 61.0


def test_a_frame_or_a_hold_ends_the_silence() -> None:
    rules = policy()
    assert rules.silence(31.0) is Silence.PING
    rules.received(32.0)
    assert not rules.pinged and rules.silence(61.0) is Silence.WAIT
    assert rules.silence(62.0) is Silence.PING  # half the timeout after the frame
    rules.held(70.0)  # backpressure: nothing is read, the server is not silent
    assert rules.silence(99.0) is Silence.WAIT and rules.silence(130.0) is Silence.GIVE_UP
