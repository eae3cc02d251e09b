"""A TCP proxy a test puts in front of MariaDB to make the database blink.

``drop()`` closes every connection through it and refuses new ones the same way (an
outage: the client reads end-of-file, "Lost connection to MySQL server"); ``hang()``
keeps accepting but forwards nothing either way (a database that stopped answering:
only the client's timeouts end a wait); ``resume()`` forwards again. Threads, not
asyncio: each connection is two pumps, few enough in a test.
"""

from __future__ import annotations

import contextlib
import socket
import threading

FORWARD, DROP, HANG = "forward", "drop", "hang"
#: Seconds a pump waits on its socket before looking at the mode again.
POLL_SECONDS = 0.05


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):  # the other side may have closed it first
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class DatabaseProxy:
    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 3306)) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_SECONDS)
        self.port = int(self._listener.getsockname()[1])
        self._mode = FORWARD
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="db-proxy", daemon=True)
        self._thread.start()

    def url(self, database_url: str) -> str:
        """``database_url`` (on the target's host and port) pointed at this proxy."""
        host, port = self.target
        return database_url.replace(f"@{host}:{port}", f"@127.0.0.1:{self.port}")

    def drop(self) -> None:
        with self._lock:
            self._mode = DROP
            links, self._links = self._links, []
        for link in links:
            link.close()

    def hang(self) -> None:
        with self._lock:
            self._mode = HANG

    def resume(self) -> None:
        with self._lock:
            self._mode = FORWARD

    def close(self) -> None:
        self._stopped.set()
        self.drop()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._mode == DROP:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            link = _Link(client, upstream)
            with self._lock:
                self._links.append(link)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(link, src, dst), daemon=True).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(POLL_SECONDS)
        while not link.closed.is_set():
            if self._mode == HANG:
                link.closed.wait(POLL_SECONDS)  # bytes wait in the kernel's buffers
                continue
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        link.close()
