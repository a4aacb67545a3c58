"""A TCP forwarder a test controls, for faults on the wire that land every time.

``TcpProxy.start(port)`` listens on a free local port and forwards each connection to
``127.0.0.1:port``. ``freeze()`` stops forwarding in both directions (connections stay
open, bytes wait in the kernel's buffers: a stalled server or network, as the client
sees it) until ``thaw()``; once ``freeze()`` returns, no further byte crosses.
``admit(n)``: only the next ``n`` new connections are forwarded, later ones are closed
as soon as they are accepted (a server that starts refusing mid-way). ``silent()``: a
port that accepts connections and never says a word.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable
from typing import Self

POLL = 0.05  # seconds a pump waits before looking at the switches again


class TcpProxy:
    """Forwards connections from ``port`` to ``127.0.0.1:target``; see the module docstring."""

    def __init__(self, target: int | None) -> None:
        self.target = target  # None: accept and never answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._admit: int | None = None
        self._socks: list[socket.socket] = []
        self._sending: list[threading.Lock] = []  # one per direction of each connection
        self._threads: list[threading.Thread] = []
        self.accepted = 0

    @classmethod
    def start(cls, target: int) -> Self:
        """A running proxy to ``127.0.0.1:target``."""
        proxy = cls(target)
        proxy._spawn(proxy._accept)
        return proxy

    @classmethod
    def silent(cls) -> Self:
        """A port that accepts connections and never answers (nothing behind it)."""
        proxy = cls(None)
        proxy._spawn(proxy._accept)
        return proxy

    def freeze(self) -> None:
        """Stop forwarding: no byte crosses after this returns, until ``thaw``."""
        self._flowing.clear()
        with self._lock:
            sending = list(self._sending)
        for lock in sending:  # a pump holding its lock is mid-copy: wait until it is done
            with lock:
                pass

    def thaw(self) -> None:
        """Forward again."""
        self._flowing.set()

    def admit(self, n: int | None) -> None:
        """Forward only the next ``n`` new connections (``None``: all)."""
        with self._lock:
            self._admit = n

    def stop(self) -> None:
        """Close every socket and wait for every thread."""
        self._stop.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        for t in list(self._threads):
            t.join(timeout=10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _keep(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.append(s)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                if not select.select([self._listener], [], [], POLL)[0]:
                    continue  # look at the stop switch again (close does not wake accept)
                client, _ = self._listener.accept()
            except (OSError, ValueError):
                return
            self.accepted += 1
            self._keep(client)
            if self.target is None:
                continue  # silent: hold it open, say nothing
            with self._lock:
                refused = self._admit is not None and self._admit <= 0
                if self._admit is not None and self._admit > 0:
                    self._admit -= 1
            if refused:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            except OSError:
                client.close()
                continue
            self._keep(server)
            for src, dst in ((client, server), (server, client)):
                lock = threading.Lock()
                with self._lock:
                    self._sending.append(lock)
                self._spawn(self._pump, src, dst, lock)

    def _pump(self, src: socket.socket, dst: socket.socket, lock: threading.Lock) -> None:
        """Copy ``src`` to ``dst`` while flowing; a closed side closes the other."""
        try:
            while not self._stop.is_set():
                if not self._flowing.wait(POLL):
                    continue
                if not select.select([src], [], [], POLL)[0]:
                    continue
                with lock:
                    if not self._flowing.is_set():
                        continue  # frozen between the look and the read: read nothing
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
        except (OSError, ValueError):  # ValueError: select on a socket ``stop`` closed
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
