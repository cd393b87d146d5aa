"""How the process stops: a second signal, a bounded shutdown, a failed start (shutdown.py)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import pytest

from apply.delta.spark.session import LazySession, SparkSetupError
from subscriber.runtime import cli, daemon, logs
from subscriber.runtime.config import Config, MetricsConfig, SparkConfig
from subscriber.runtime.embedded import REPO, free_port
from subscriber.runtime.shutdown import ForcedExit, ShutdownTimedOut, captured_signals, join_within


def test_a_first_signal_asks_to_stop_and_a_second_exits_at_once() -> None:
    stopping = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    with captured_signals(stopping):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stopping.wait(5)
        with pytest.raises(ForcedExit) as forced:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here, in the main thread
    assert forced.value.exit_code == 128 + signal.SIGINT and forced.value.signal == "SIGINT"
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_a_shutdown_waits_for_its_threads_at_most_its_timeout() -> None:
    release = threading.Event()
    quick = threading.Thread(target=lambda: None, name="quick")
    stuck = threading.Thread(target=release.wait, name="stuck", daemon=True)
    quick.start()
    stuck.start()
    started = time.monotonic()
    assert join_within([quick, stuck], 0.3) == ["stuck"]
    assert time.monotonic() - started < 5
    release.set()
    assert join_within([stuck], 5) == []


def test_a_failed_spark_start_still_stops_the_http_endpoint(monkeypatch: Any) -> None:
    def no_spark(settings: Any) -> Any:
        raise RuntimeError("the JVM did not start")

    monkeypatch.setattr(daemon, "build_session", no_spark)
    port = free_port()
    process = daemon.Daemon(
        Config(
            metrics=MetricsConfig(host="127.0.0.1", port=port),
            spark=SparkConfig(start="at_start"),  # on_demand starts none before replication
        )
    )
    with pytest.raises(RuntimeError, match="did not start"):
        process.run()
    assert process.server is not None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # nothing listens any more


def test_a_spark_session_that_cannot_start_when_first_needed_stops_the_daemon() -> None:
    """``spark.start: on_demand``: a JVM that cannot start at its first use fails that work
    with what happened, and the daemon exits 1 to be restarted, as one lost later does."""

    def no_jvm() -> Any:
        raise RuntimeError("Java gateway process exited before sending its port number")

    process = daemon.Daemon(Config(metrics=MetricsConfig(host="127.0.0.1", port=free_port())))
    process.spark = LazySession(no_jvm, master="local[*]", remote=False)
    assert process.check_spark()  # not started yet: nothing to lose
    with pytest.raises(SparkSetupError, match="could not start: Java gateway"):
        process.spark.sql("SELECT 1")
    assert not process.check_spark() and process.jvm_lost and process.stop_requested.is_set()


@pytest.mark.parametrize(
    ("raised", "code"),
    [(ForcedExit(signal.SIGTERM), 143), (ShutdownTimedOut("threads left: ['sub1']"), 1)],
)
def test_the_cli_exits_without_waiting_for_threads_left_running(
    monkeypatch: Any, capsys: Any, raised: BaseException, code: int
) -> None:
    def run(args: Any) -> int:
        raise raised

    def exit_now(exit_code: int) -> None:
        raise SystemExit(exit_code)  # stands in for os._exit, which would end pytest

    monkeypatch.setitem(cli._COMMANDS, "run", run)
    monkeypatch.setattr(cli, "_exit_now", exit_now)
    monkeypatch.setattr(logs, "configure", lambda *args: None)  # pytest's own logging
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "-c", "pgsub.yaml"])
    assert exited.value.code == code
    assert "Traceback" not in capsys.readouterr().err


def test_the_cli_reports_an_interrupt_without_a_traceback(monkeypatch: Any, capsys: Any) -> None:
    def run(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli._COMMANDS, "run", run)
    monkeypatch.setattr(logs, "configure", lambda *args: None)  # pytest's own logging
    assert cli.main(["run", "-c", "pgsub.yaml"]) == 130
    assert capsys.readouterr().err.strip() == "pgsub run: interrupted"


def test_embedded_clusters_look_for_binaries_under_the_repository() -> None:
    """setup/postgres.sh, run as a user, installs into <repository>/.pg/<major>."""
    assert (REPO / "Makefile").is_file() and (REPO / "setup" / "postgres.sh").is_file()
