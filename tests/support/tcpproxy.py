"""A small TCP proxy on loopback whose connections a test can cut, or slow down."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = threading.Event()
        self.accepted = 0
        self.rate: float | None = None  # bytes/s from the server, per connection (None: any)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._pairs.append((client, upstream))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peers = {client: upstream, upstream: client}
        with selectors.DefaultSelector() as selector:
            try:
                for sock in peers:
                    selector.register(sock, selectors.EVENT_READ)
            except (ValueError, OSError):  # cut before this thread began: already closed
                self._close_pair(client, upstream)
                return
            try:
                while True:
                    for key, _ in selector.select():
                        rate = self.rate if key.fileobj is upstream else None
                        data = key.fileobj.recv(4096 if rate else 65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        peers[key.fileobj].sendall(data)  # type: ignore[index]
                        if rate:
                            time.sleep(len(data) / rate)
            except OSError:
                return
            finally:
                self._close_pair(client, upstream)

    @staticmethod
    def _close_pair(*socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> int:
        """Break every open connection; new ones are still accepted."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._close_pair(*pair)
        return len(pairs)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.cut()
