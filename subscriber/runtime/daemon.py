"""``pgsub run``: the long-lived daemon (uvicorn's shape: config, startup, main loop, shutdown).

Startup builds the one Spark session of the process, the HTTP endpoint and
a ``SubscriptionRunner`` thread per enabled subscription. The main loop
waits for SIGTERM or SIGINT. Shutdown stops taking changes, lets a batch
being written finish (its commit is atomic either way), sends a last
status update and returns 0; it waits ``shutdown_timeout`` at most, then
gives up on the threads still running (exit 1: nothing unconfirmed was
confirmed, so what they held is sent again). A second SIGTERM or SIGINT
ends the process at once (``ForcedExit``, uvicorn's habit), as safely as a
kill -9: the slot is only ever confirmed up to what Delta holds.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import structlog

from apply.delta.files.store_check import StoreError, check_store
from apply.delta.spark.session import (
    SparkSettings,
    build_session,
    lazy_session,
    masked_spark_url,
    start_failure,
    started,
)
from apply.delta.state_store import CheckpointStore
from subscriber.metrics import Metrics
from subscriber.runtime.config import Config, ConfigError
from subscriber.runtime.http import StatusServer
from subscriber.runtime.maintenance import Maintenance
from subscriber.runtime.shutdown import ShutdownTimedOut, captured_signals, join_within
from subscriber.runtime.subscription import SubscriptionRunner

log = structlog.get_logger(__name__)

# How often the main thread checks that the Spark JVM still answers.
JVM_CHECK_INTERVAL = 5.0
# The longest a shutdown waits for the subscriptions' threads (the Helm chart's grace
# period is 300 s): a batch being written finishes well within it.
SHUTDOWN_TIMEOUT = 240.0


# New container objects between two runs of the cyclic garbage collector
# (Python's default: 700). pgsub makes a few per row change - the change, its
# image, its net row in a batch - and at the default pace the collector took
# a quarter of the receiver thread's time on a large transaction. Row data
# holds bytes and None, never cycles, so fewer, larger runs lose nothing:
# what a run finds alive it traverses and moves on, and a batch's changes
# die with its write, so the fewer runs a batch outlives the better. At
# 100,000 the collector took 0.75-1.0 s of a 200,000-transaction backlog's
# drain (19 young runs, 2 middle ones, every thread stopped); at 400,000,
# 0.32-0.41 s in 4 runs of about 90 ms (docs/performance.md, "The backlog's
# slot past its load, and the collector's pace").
COLLECTOR_THRESHOLD: Final = 400_000


def tune_garbage_collector() -> None:
    """Fewer collector runs, and none over what startup made (modules, Spark's py4j state)."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(COLLECTOR_THRESHOLD, older, oldest)


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
        self.shutdown_timeout = SHUTDOWN_TIMEOUT
        self.abandoned: list[str] = []  # threads still running when the shutdown gave up

    def run(self) -> int:
        with captured_signals(self.stop_requested):
            try:
                self._startup()
                threads = [
                    threading.Thread(
                        target=runner.run, args=(self.stopping,), name=runner.name, daemon=True
                    )
                    for runner in self.runners
                ]
                if self.config.maintenance.enabled:
                    maintenance = Maintenance(
                        self.runners,
                        self.spark,
                        self.config.warehouse,
                        self.config.maintenance,
                        self.metrics,
                    )
                    threads.append(
                        threading.Thread(
                            target=maintenance.run,
                            args=(self.stopping,),
                            name="maintenance",
                            daemon=True,
                        )
                    )
                for thread in threads:
                    thread.start()
                while not self.stop_requested.wait(JVM_CHECK_INTERVAL):
                    self.check_spark()
                # A signal to the whole process group stops the JVM too: look once more, before
                # the demo's catch-up (which may need no Spark, and so would not notice).
                alive = self.check_spark()
                if self.before_stop is not None and alive:
                    self.before_stop()
                self.stopping.set()
                self._join(threads)
            finally:
                self._shutdown()
        log.info("pgsub stopped")
        if self.abandoned:
            raise ShutdownTimedOut(f"threads still running after the shutdown: {self.abandoned}")
        return 1 if self.jvm_lost else 0

    def check_spark(self) -> bool:
        """Whether the Spark JVM still answers; when it does not, say so once and stop."""
        if self.jvm_lost:
            return False
        failure = start_failure(self.spark) if self.spark is not None else None
        if failure is not None:
            self.jvm_lost = True
            log.error(
                "the Spark session could not start; exiting so that pgsub is restarted",
                error=str(failure),
                hint="something needed Spark (a large table, a schema change, maintenance: docs/"
                'operations.md, "The JVM on demand"); see the '
                "JVM's log lines above (often: no Java, or too little memory for the JVM)",
            )
            self.stop_requested.set()
            return False
        if self._spark_alive():
            return True
        self.jvm_lost = True
        log.error(
            "the Spark JVM is gone; exiting so that pgsub is restarted",
            hint="see the JVM's last log lines above (often: out of memory, or a signal sent "
            "to the whole process group, which the JVM shares)",
        )
        self.stop_requested.set()
        return False

    def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for ``threads``, ``shutdown_timeout`` at most in all."""
        self.abandoned = join_within(threads, self.shutdown_timeout)
        if self.abandoned:
            log.error(
                "shutdown timed out: exiting without waiting for these threads",
                threads=self.abandoned,
                timeout=self.shutdown_timeout,
                hint="nothing they held was confirmed to the publisher; it is sent again",
            )

    def _spark_alive(self) -> bool:
        """A local or cluster Spark driver answers (Spark Connect: the server's own business)."""
        if self.spark is None or self.config.spark.remote is not None:
            return True
        if not started(self.spark):
            return True  # no table has needed Spark yet: no JVM to lose
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
        try:  # before a row is written there
            check_store(config.warehouse, f"subscriptions {', '.join(s.name for s in enabled)}")
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
        settings = SparkSettings(
            master=config.spark.master,
            remote=config.spark.remote,
            conf=config.spark_conf(),
            jvm_traces=config.log.level == "debug",
        )
        at_start = config.spark.start == "at_start"
        spark = self.spark = build_session(settings) if at_start else lazy_session(settings)
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
                    spark_sees_warehouse=config.spark.sees_warehouse_answer(),
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
