"""A writer process runs each table's asks one at a time in the order they were sent, and
different tables' side by side (``merge_processes._InOrder``): a warm sent without waiting
is not overtaken by the table's first merge."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from apply.delta.writer.merge_processes import _InOrder


def test_a_tables_work_runs_in_the_order_sent_and_never_two_at_once() -> None:
    done: dict[str, list[int]] = {"a": [], "b": []}
    running = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    lock = threading.Lock()

    def work(key: str, n: int) -> None:
        with lock:
            running[key] += 1
            most[key] = max(most[key], running[key])
        time.sleep(0.001 if n % 3 else 0.004)  # some slower, to give a later one a chance
        with lock:
            running[key] -= 1
            done[key].append(n)

    with ThreadPoolExecutor(4) as pool:
        in_order = _InOrder(pool)
        for n in range(200):
            for key in ("a", "b"):
                in_order.submit(key, lambda key=key, n=n: work(key, n))  # type: ignore[misc]
    assert done == {"a": list(range(200)), "b": list(range(200))}
    assert most == {"a": 1, "b": 1}
    assert not in_order._waiting  # every key's runner let go


def test_tables_run_side_by_side_and_a_failure_does_not_stop_the_next() -> None:
    both = threading.Barrier(2, timeout=10)
    after: list[str] = []

    def meet() -> None:
        both.wait()  # raises BrokenBarrierError unless the other table runs meanwhile

    def fail() -> None:
        raise RuntimeError("a pipe gone")

    with ThreadPoolExecutor(2) as pool:
        in_order = _InOrder(pool)
        in_order.submit("a", meet)
        in_order.submit("b", meet)
        in_order.submit("a", fail)
        in_order.submit("a", lambda: after.append("a"))
    assert not both.broken
    assert after == ["a"]
    assert not in_order._waiting
