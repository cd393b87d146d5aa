"""The HTTP endpoint alone: each route, its codes and types, and nothing but GET and HEAD."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from subscriber.runtime.http import StatusServer


@pytest.fixture
def server() -> Iterator[tuple[StatusServer, dict[str, Any]]]:
    registry = CollectorRegistry()
    Counter("pgsub_example", "an example", registry=registry).inc(3)
    state: dict[str, Any] = {"healthy": True, "ready": False}
    served = StatusServer(
        "127.0.0.1",
        0,  # a free port, chosen by the kernel
        registry=registry,
        health=lambda: (state["healthy"], {"why": "ok" if state["healthy"] else "stuck"}),
        readiness=lambda: (state["ready"], {"streaming": state["ready"]}),
        status=lambda: {"subscriptions": [{"name": "sub1", "state": "streaming"}]},
    )
    served.start()
    yield served, state
    served.stop()


def call(server: StatusServer, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"] or "", exc.read()


def test_each_route_answers_with_its_code_and_type(
    server: tuple[StatusServer, dict[str, Any]],
) -> None:
    served, state = server
    code, kind, body = call(served, "/metrics")
    assert code == 200 and kind.startswith("text/plain") and b"pgsub_example_total 3.0" in body
    assert call(served, "/healthz")[0] == 200
    code, kind, body = call(served, "/readyz")
    assert (code, kind) == (503, "application/json")
    assert json.loads(body) == {"ok": False, "streaming": False}
    state["healthy"], state["ready"] = False, True
    assert json.loads(call(served, "/healthz")[2]) == {"ok": False, "why": "stuck"}
    assert call(served, "/healthz")[0] == 503 and call(served, "/readyz")[0] == 200
    code, _, body = call(served, "/status?pretty")  # a query string names the same route
    assert code == 200 and json.loads(body)["subscriptions"][0]["name"] == "sub1"
    code, kind, body = call(served, "/")
    assert code == 200 and kind.startswith("text/html") and b"<html" in body.lower()
    assert call(served, "/nowhere")[0] == 404


def test_only_get_and_head_are_answered(server: tuple[StatusServer, dict[str, Any]]) -> None:
    served, _ = server
    code, _, body = call(served, "/status", "HEAD")
    assert code == 200 and body == b""
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        code, _, _ = call(served, "/status", method)
        assert code == 405, method


def test_a_status_is_one_line_of_json() -> None:
    """Encoded by json's C encoder (no indent): a status of hundreds of tables, asked for
    every 50 ms by a client, must not take the daemon's Python lock for milliseconds each."""
    tables = [{"table": f"public.t{i}", "state": "ready", "lsn": "0/1"} for i in range(500)]
    served = StatusServer(
        "127.0.0.1",
        0,
        registry=CollectorRegistry(),
        health=lambda: (True, {}),
        readiness=lambda: (True, {}),
        status=lambda: {"subscriptions": [{"name": "sub1", "tables": tables}]},
    )
    served.start()
    try:
        code, kind, body = call(served, "/status")
    finally:
        served.stop()
    assert (code, kind) == (200, "application/json")
    assert body.count(b"\n") == 1 and body.endswith(b"\n")
    assert json.loads(body)["subscriptions"][0]["tables"] == tables
