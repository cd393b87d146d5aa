"""``pgsub run``: the long-lived daemon (uvicorn's shape: config, startup, main loop, shutdown).

Startup builds the one Spark session of the process, the HTTP endpoint and
a ``SubscriptionRunner`` thread per enabled subscription. The main loop
waits for SIGTERM or SIGINT. Shutdown stops taking changes, lets a batch
being written finish (its commit is atomic either way), sends a last
status update and returns 0.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Final

import structlog

from apply.delta.session import SparkSettings, build_session, masked_spark_url
from apply.delta.state_store import CheckpointStore
from subscriber.metrics import Metrics
from subscriber.runtime.config import Config
from subscriber.runtime.http import StatusServer
from subscriber.runtime.maintenance import Tender
from subscriber.runtime.subscription import SubscriptionRunner

log = structlog.get_logger(__name__)

# How often the main thread checks that the Spark JVM still answers.
JVM_CHECK_INTERVAL = 5.0

# New container objects between two runs of the cyclic garbage collector
# (Python's default: 700). pgsub makes a few per row change - the change, its
# image, its net row in a batch - and at the default pace the collector took
# a quarter of the receiver thread's time on a large transaction. Row data
# holds bytes and None, never cycles, so fewer, larger runs lose nothing.
COLLECTOR_THRESHOLD: Final = 100_000


def tune_garbage_collector() -> None:
    """Fewer collector runs, and none over what startup made (modules, Spark's py4j state)."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(COLLECTOR_THRESHOLD, older, oldest)


@contextmanager
def captured_signals(stopping: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stopping`` for the duration; the old handlers come back after."""

    def handle(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            log.info("shutdown requested", signal=signal.Signals(signum).name)
        stopping.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.stop_requested = threading.Event()  # by a signal, or by whoever embeds the daemon
        self.stopping = threading.Event()  # what the subscription threads watch
        # Called between the stop request and stopping, e.g. to let replication catch up.
        self.before_stop: Callable[[], None] | None = None
        self.runners: list[SubscriptionRunner] = []
        self.server: StatusServer | None = None
        self.spark: Any = None
        self.started_at = time.time()
        self.jvm_lost = False

    def run(self) -> int:
        with captured_signals(self.stop_requested):
            self._startup()
            try:
                threads = [
                    threading.Thread(
                        target=runner.run, args=(self.stopping,), name=runner.name, daemon=True
                    )
                    for runner in self.runners
                ]
                if self.config.maintenance.enabled:
                    tender = Tender(
                        self.runners,
                        self.spark,
                        self.config.warehouse,
                        self.config.maintenance,
                        self.metrics,
                    )
                    threads.append(
                        threading.Thread(
                            target=tender.run,
                            args=(self.stopping,),
                            name="maintenance",
                            daemon=True,
                        )
                    )
                for thread in threads:
                    thread.start()
                while not self.stop_requested.wait(JVM_CHECK_INTERVAL):
                    if not self._spark_alive():
                        self.jvm_lost = True
                        log.error(
                            "the Spark JVM is gone; exiting so that pgsub is restarted",
                            hint="see the JVM's last log lines above (often: out of memory)",
                        )
                        self.stop_requested.set()
                if self.before_stop is not None:
                    self.before_stop()
                self.stopping.set()
                for thread in threads:
                    thread.join()
            finally:
                self._shutdown()
        log.info("pgsub stopped")
        return 1 if self.jvm_lost else 0

    def _spark_alive(self) -> bool:
        """A local or cluster Spark driver answers (Spark Connect: the server's own business)."""
        if self.spark is None or self.config.spark.remote is not None:
            return True
        try:
            return not self.spark.sparkContext._jsc.sc().isStopped()
        except Exception:  # noqa: BLE001 - any failure to reach the JVM means it is gone
            return False

    def _startup(self) -> None:
        config = self.config
        enabled = [s for s in config.subscriptions if s.enabled]
        log.info(
            "pgsub starting",
            warehouse=config.warehouse,
            spark=masked_spark_url(config.spark.remote or config.spark.master),
            subscriptions=[s.name for s in enabled],
        )
        self.server = StatusServer(
            config.metrics.host,
            config.metrics.port,
            registry=self.metrics.registry,
            health=self.health,
            readiness=self.readiness,
            status=self.status,
        )
        self.server.start()
        log.info("http endpoint listening", host=config.metrics.host, port=self.server.port)
        spark = self.spark = build_session(
            SparkSettings(
                master=config.spark.master,
                remote=config.spark.remote,
                conf=config.spark.conf,
                jvm_traces=config.log.level == "debug",
            )
        )
        tune_garbage_collector()
        checkpoints = CheckpointStore(spark, config.warehouse)
        for sub in config.subscriptions:
            if not sub.enabled:
                self.metrics.subscription_enabled.labels(sub.name).set(0)
                continue
            self.runners.append(
                SubscriptionRunner(
                    sub,
                    spark,
                    config.warehouse,
                    checkpoints,
                    self.metrics,
                    maintenance=config.maintenance.policy(),
                )
            )

    def _shutdown(self) -> None:
        self.stopping.set()
        if self.server is not None:
            self.server.stop()

    # -- probes --------------------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether this process can make progress (liveness): a subscription that is failing
        and retrying, or disabled, can; a hung thread or a batch that never ends cannot."""
        now = time.time()
        stuck = {r.name: why for r in self.runners if (why := r.stuck(now)) is not None}
        if self.jvm_lost:
            stuck["spark"] = "the Spark JVM is gone"
        return not stuck, {"stuck": stuck}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Every enabled subscription streams (one disabled on purpose is not waited for)."""
        waiting = [r.name for r in self.runners if not r.ready and r.status.state != "disabled"]
        return bool(self.runners) and not waiting, {"not_streaming": waiting}

    def status(self) -> dict[str, Any]:
        return {"subscriptions": [r.status.as_dict() for r in self.runners]}
