"""The daemon's HTTP endpoint: read-only ``/metrics``, ``/healthz``, ``/readyz``, ``/status``,
and ``/``, a status page for a browser.

Only GET and HEAD are answered; anything else is 405. Nothing here changes
state. ``/healthz`` fails when the process cannot make progress;
``/readyz`` when an enabled subscription is not streaming.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Probe = Callable[[], tuple[bool, dict[str, Any]]]


class StatusServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        registry: CollectorRegistry,
        health: Probe,
        readiness: Probe,
        status: Callable[[], dict[str, Any]],
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _probe(health),
            "/readyz": lambda: _probe(readiness),
            "/status": lambda: (200, "application/json", _json(status())),
            "/": lambda: (200, "text/html; charset=utf-8", _PAGE),
        }

        class Handler(BaseHTTPRequestHandler):
            server_version = "pgsub"

            def _answer(self, body: bool) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    code, kind, payload = 404, "text/plain", b"not found\n"
                else:
                    code, kind, payload = route()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def do_GET(self) -> None:  # the http.server protocol
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _refuse(self) -> None:
                self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
                self.send_header("Allow", "GET, HEAD")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes every few seconds would drown the event log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# The read-only status page: what `pgsub status` shows, from /status, in a browser.
_PAGE = (Path(__file__).with_name("static") / "status.html").read_bytes()


def _json(value: Any) -> bytes:
    """One line: without ``indent`` json encodes in C. Indented, in Python, a /status of
    200 tables took 5.3 ms of the daemon's Python lock against 1.2 (docs/performance.md, "A
    cold start's /status, answered in C"); `pgsub status --json` prints it indented."""
    return (json.dumps(value, default=str) + "\n").encode()


def _probe(probe: Probe) -> tuple[int, str, bytes]:
    ok, detail = probe()
    return (200 if ok else 503), "application/json", _json({"ok": ok, **detail})
