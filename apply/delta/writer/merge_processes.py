"""Keyed batches of a local warehouse's tables merged in writer processes of their own.

A batch of many small tables is bound by Python's lock: four writer threads
of the apply process wait for it by turns at every Arrow call and system
call. With ``writer_processes: P`` each table's keyed batch is merged by one
of P processes instead (``LocalMerges`` there, the table's open log and key
index with it), chosen by the table's path, so a table is always written by
the same process. The apply process's writer thread sends the net effect
(pickled, about 50 us) and waits for the ``WriteResult``; nothing else of the
batch changes: the commit carries its mark, is read back and made durable by
the apply process (``DeltaTables._settled``), and the flush is confirmed only
from there. Measured in docs/performance.md, "Writer processes, measured".

A table's key index is read in its process after its copy (``warm``),
sent without waiting: the copy lets go of its table at once, and the
process runs each table's asks - the warm, a ``forget``, its merges - one
at a time in the order they were sent (``_InOrder``), so the first batch
waits for the warm only if it comes before the warm is done.

What a process knows of a table is dropped with ``forget`` wherever the
apply process drops its own (a schema change, a commit replaced, a table
made anew). An error in a process is raised in the writer thread as the
error it was; a process that exits fails the writes it had (nothing
confirmed, the batch retried) and is started again at its next write. The
processes start with the subscription (``start``) and exit with the daemon:
``close``, or, when the daemon is killed, at the end of their pipe.

``writer_processes: auto`` (the daemon's default) chooses as the subscription
starts (``auto_processes``): two processes when it has at least
``AUTO_TABLES`` tables and the daemon may use two cores (``usable_cpus``: its
cgroup's CPU quota, as a container's limit sets it, and its CPU affinity -
not the node's count), none otherwise. Many small tables are where the
processes pay: a batch of a thousand tables is mostly each table's fixed
Python, which the processes share out. Fewer tables take more changes each,
and the processes' own CPU (each net pickled over and read back, each table
open twice) then costs more than the lock they spare: at 200 tables they
shave a tenth off the lag at 1,000 changes a second, but fall behind at
8,000 a second where the threads keep up, with the publisher on the same
two cores; a few large tables drain a backlog faster by the threads too
(docs/performance.md, "Writer processes chosen by themselves" and "8,000/s
over 200 tables with writer processes").
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import multiprocessing
import os
import pickle
import signal
import threading
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import structlog

from apply.core.errors import TargetTableError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from apply.batching.collapse import KeyedNet
    from apply.columns.schema import TargetSchema
    from apply.core.features import TableFeatures
    from apply.core.records import CommitMark, WriteResult
    from apply.history.stamps import Stamping

# Tables a process merges at once (its share of the apply process's writers).
THREADS: Final = 2
# What the server the processes are forked from imports first (the writer's modules).
SERVER_MODULE: Final = "apply.delta.writer.writer_server"
CLOSE_SECONDS: Final = 30.0
# ``writer_processes: auto``: this many processes for a subscription of at least
# ``AUTO_TABLES`` tables, when the daemon may use as many cores.
AUTO_PROCESSES: Final = 2
AUTO_TABLES: Final = 1000
CGROUPS: Final = Path("/sys/fs/cgroup")

log = structlog.get_logger(__name__)

# ``writer_processes``: a number of processes (0: the apply process's threads), or ``auto``.
WriterProcesses = int | Literal["auto"]


def auto_processes(tables: int, cpus: int) -> int:
    """How many writer processes ``writer_processes: auto`` runs for a subscription of
    ``tables`` tables and the ``cpus`` cores it may use (see the module's docstring)."""
    return AUTO_PROCESSES if tables >= AUTO_TABLES and cpus >= AUTO_PROCESSES else 0


def usable_cpus(membership: str | None = None, root: Path = CGROUPS) -> int:
    """The cores this process may use: its CPU affinity, bounded by the CPU quota of its
    cgroup and of every cgroup above it (a container's CPU limit), rounded up.
    ``membership``: ``/proc/self/cgroup``'s text."""
    cpus = len(os.sched_getaffinity(0))
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text()
        except OSError:
            return cpus
    quotas = [q for folder in _cpu_folders(membership, root) if (q := _quota(folder))]
    return max(1, min(cpus, math.ceil(min(quotas)))) if quotas else cpus


def _cpu_folders(membership: str, root: Path) -> list[Path]:
    """The folders of the cgroups that may hold this process's CPU quota, its own and each
    above it: v2 (``0::/path``) and v1's ``cpu`` controller (``4:cpu,cpuacct:/path``)."""
    folders: list[Path] = []
    for line in membership.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            base = root
        elif "cpu" in controllers.split(","):
            base = root / controllers if (root / controllers).is_dir() else root / "cpu"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        folders += [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return folders


def _quota(folder: Path) -> float | None:
    """A cgroup's CPU quota in cores (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``); None when it
    has none, or the folder is not there."""
    try:
        limit, period = (folder / "cpu.max").read_text().split()[:2]  # v2: "max 100000"
    except (OSError, ValueError):
        try:
            limit = (folder / "cpu.cfs_quota_us").read_text().strip()  # v1: -1 for none
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if not (limit.isdigit() and period.isdigit()) or not int(period):
        return None  # "max", -1
    return int(limit) / int(period)


class MergeProcesses:
    """``LocalMerges.merge``, ``warm`` and ``forget``, each table's in its own process."""

    def __init__(
        self,
        count: int,
        max_bytes: int,
        features: TableFeatures,
        setup: Callable[[], None] | None = None,
    ) -> None:
        """``setup``: what a process runs first (the daemon's log configuration); picklable."""
        self._settings = (max_bytes, features, setup)
        self._shards = [_Shard(number, self._settings) for number in range(count)]
        self._starting: threading.Thread | None = None

    def start(self, then: Callable[[], None] | None = None) -> None:
        """The processes started in the background (about a second: their server imports
        the writer's modules), not by the first copy's warm; one not started is started by
        its first ask. ``then``: called once every process has started."""
        self._starting = threading.Thread(
            target=self._start_all,
            args=(then,),
            name="writer-processes-start",
            daemon=True,
        )
        self._starting.start()

    def _start_all(self, then: Callable[[], None] | None) -> None:
        for shard in self._shards:
            shard.start()
        if then is not None and all(shard.running for shard in self._shards):
            then()

    def merge(
        self,
        path: str,
        schema: TargetSchema,
        net: KeyedNet,
        mark: CommitMark,
        *,
        stamping: Stamping,
    ) -> WriteResult | None:
        # A batch's commits are its transactions, made into pairs when asked
        # (``forming.Commits``): only a stamped table's merge asks, so only its are sent.
        sent = replace(net, commits=list(net.commits) if stamping.stamps else ())
        result: WriteResult | None = self._of(path).ask("merge", path, schema, sent, mark, stamping)
        return result

    def warm(self, path: str, schema: TargetSchema) -> None:
        """The table's key index read in its process after its copy (``LocalMerges.warm``),
        not waited for: the table's next ask runs after it in the process."""
        self._of(path).send("warm", path, schema).add_done_callback(
            lambda done: _warm_failed(path, done)
        )

    def take_over(self, tables: list[tuple[str, TargetSchema]]) -> None:
        """Each of ``tables`` (path, schema) opened in its process, its key index read, and
        waited for: before the processes take over tables the threads have written, so that
        their first batches do not open them (a second over 200 tables)."""
        sent = [(path, self._of(path).send("warm", path, schema)) for path, schema in tables]
        for path, answer in sent:
            try:
                answer.result()
            except TargetTableError as exc:  # its process gone: left to the table's next ask
                log.info("table left to its first batch", path=path, error=str(exc))

    def forget(self, path: str) -> None:
        shard = self._of(path)
        if shard.running:  # a process started later knows nothing of the table
            shard.ask("forget", path)

    def pids(self) -> list[int]:
        """The running processes' ids."""
        return [pid for shard in self._shards if (pid := shard.pid) is not None]

    def close(self) -> None:
        if self._starting is not None:  # none started after the others stopped
            self._starting.join()
        stopped = [shard.close() for shard in self._shards]
        if any(stopped):
            log.info("writer processes stopped", processes=sum(stopped))

    def _of(self, path: str) -> _Shard:
        return self._shards[zlib.crc32(path.encode()) % len(self._shards)]


class _Shard:
    """One writer process and the writes waiting on it."""

    def __init__(
        self, number: int, settings: tuple[int, TableFeatures, Callable[[], None] | None]
    ) -> None:
        self._number = number
        self._settings = settings
        self._lock = threading.Lock()  # the process, its pipe, the writes waiting
        self._sending = threading.Lock()  # one message at a time down the pipe
        self._asks = itertools.count()
        self._waiting: dict[int, Future[Any]] = {}
        self._process: BaseProcess | None = None
        self._pipe: Connection | None = None

    @property
    def pid(self) -> int | None:
        with self._lock:
            return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        with self._lock:
            return self._pipe is not None

    def start(self) -> None:
        """The process started, if it is not running; a failure is left to the next ask."""
        try:
            with self._lock:
                self._started()
        except OSError as exc:
            log.warning("writer process not started", process=self._number, error=str(exc))

    def ask(self, what: str, *args: Any) -> Any:
        return self.send(what, *args).result()

    def send(self, what: str, *args: Any) -> Future[Any]:
        """The ask sent; its answer, when it comes."""
        future: Future[Any] = Future()
        with self._lock:
            pipe = self._started()
            number = next(self._asks)
            self._waiting[number] = future
        try:
            with self._sending:  # not under _lock: the answers are read meanwhile
                pipe.send((number, what, args))
        except (OSError, ValueError) as exc:
            with self._lock:
                self._waiting.pop(number, None)
            raise self._gone(f"could not be reached ({exc})") from exc
        return future

    def _started(self) -> Connection:
        """The process's end of the pipe, the process started first if it is not running."""
        if self._pipe is not None:
            return self._pipe
        context = multiprocessing.get_context("forkserver")
        # The server imports the writer's modules once; each process forked from it
        # shares their pages instead of importing them again.
        context.set_forkserver_preload([SERVER_MODULE])
        near, far = context.Pipe()
        process = context.Process(
            target=_serve,
            args=(far, *self._settings),
            name=f"pgsub-writer-{self._number}",
            daemon=True,
        )
        process.start()
        far.close()
        self._process, self._pipe = process, near
        threading.Thread(
            target=self._answers, args=(near, process), name=f"writer-{self._number}-answers",
            daemon=True,
        ).start()  # fmt: skip
        log.info("writer process started", process=self._number, pid=process.pid)
        return near

    def _answers(self, pipe: Connection, process: BaseProcess) -> None:
        """Each answer to the write that waits for it; at the pipe's end, every write left
        failed and the process let go (started again by the next write)."""
        while True:
            try:
                number, failed, value = pipe.recv()
            except (EOFError, OSError):
                break
            except Exception:  # an answer that cannot be read: no later one can be trusted
                log.exception("writer process answer unreadable", process=self._number)
                process.kill()
                break
            with self._lock:
                future = self._waiting.pop(number, None)
            if future is None:
                continue
            if failed:
                future.set_exception(value)
            else:
                future.set_result(value)
        process.join(timeout=CLOSE_SECONDS)
        with self._lock:
            if self._pipe is pipe:
                self._pipe, self._process = None, None
            left, self._waiting = self._waiting, {}
        pipe.close()
        if left:
            error = self._gone(f"exited (code {process.exitcode})")
            log.error(
                "writer process exited", process=self._number, exitcode=process.exitcode,
                writes_failed=len(left),
            )  # fmt: skip
            for future in left.values():
                future.set_exception(error)

    def _gone(self, what: str) -> TargetTableError:
        return TargetTableError(
            f"writer process {self._number} {what}: the tables' writes it had are not "
            "confirmed and are written again (the process starts again); if it repeats, "
            "set writer_processes: 0 and report it"
        )

    def close(self) -> bool:
        """The process ended, if it runs (True)."""
        with self._lock:
            pipe, process = self._pipe, self._process
        if pipe is None or process is None:
            return False
        with contextlib.suppress(OSError, ValueError), self._sending:
            pipe.send(None)
        process.join(timeout=CLOSE_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
        return True


def _serve(
    pipe: Connection, max_bytes: int, features: TableFeatures, setup: Callable[[], None] | None
) -> None:
    """A writer process: each ask answered, ``THREADS`` tables at a time, each table's asks in
    the order sent; it ends when asked (``None``) or when the apply process is gone (its
    pipe ends)."""
    from apply.delta.writer.local_merge import LocalMerges

    # The daemon decides when to stop (a terminal's Ctrl-C reaches its whole group): its
    # writes finish, then it closes the pipe. A SIGTERM ends the process (multiprocessing's
    # own at the daemon's exit): a write cut short is not confirmed, its files unnamed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if setup is not None:
        setup()
    merges = LocalMerges(max_bytes, features=features)
    sending = threading.Lock()

    def answer(number: int, what: str, args: tuple[Any, ...]) -> None:
        try:
            value: Any = None
            if what == "merge":
                path, schema, net, mark, stamping = args
                value = merges.merge(path, schema, net, mark, stamping=stamping)
            elif what == "warm":
                merges.warm(*args)
            else:
                merges.forget(*args)
            reply: tuple[int, bool, Any] = (number, False, value)
        except Exception as exc:  # noqa: BLE001 - raised in the apply process's writer thread
            reply = (number, True, _picklable(exc))
        with sending:
            pipe.send(reply)

    with ThreadPoolExecutor(THREADS, thread_name_prefix="merge") as pool:
        in_order = _InOrder(pool)
        while True:
            try:
                ask = pipe.recv()
            except (EOFError, OSError):
                break  # the apply process is gone: writes under way finish, none is confirmed
            if ask is None:
                break
            number, what, args = ask
            in_order.submit(args[0], functools.partial(answer, number, what, args))


class _InOrder:
    """Work run on a pool, each key's (a table's path) one at a time in the order it came;
    different keys' side by side."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[Callable[[], None]]] = {}  # the keys being run

    def submit(self, key: str, work: Callable[[], None]) -> None:
        with self._lock:
            waiting = self._waiting.get(key)
            if waiting is not None:  # run by the key's runner after the work before it
                waiting.append(work)
                return
            self._waiting[key] = deque()
        self._pool.submit(self._run, key, work)

    def _run(self, key: str, work: Callable[[], None]) -> None:
        while True:
            try:
                work()
            except Exception:
                log.exception("writer process ask failed", path=key)
            with self._lock:
                waiting = self._waiting[key]
                if not waiting:
                    del self._waiting[key]
                    return
                work = waiting.popleft()


def _warm_failed(path: str, done: Future[Any]) -> None:
    """A warm that did not finish (its process exited): the first batch reads the index."""
    if not done.cancelled() and (error := done.exception()) is not None:
        log.info("key index left to the first batch", path=path, error=str(error))


def _picklable(error: Exception) -> Exception:
    """``error``, or a TargetTableError saying what it was where it does not pickle."""
    try:
        pickle.loads(pickle.dumps(error))  # noqa: S301 - our own error, made just now
    except Exception:  # noqa: BLE001 - any that does not survive the trip
        return TargetTableError(f"{type(error).__name__}: {error}")
    return error
