"""A TCP proxy between a gateway process and the session's Redis (real sockets both ways), for tests that
stop or hold the gateway's Redis traffic at a chosen command or reply."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import parse_qs, urlparse


class RedisProxy:
    """Forwards TCP connections to the session's Redis, a thread per direction. `stop_at(marker, where)`:
    the first client command chunk holding every part of `marker` stops its connection, `where` "request":
    the chunk is never forwarded (nor anything after it); "reply": it is forwarded, and no reply after it
    reaches the client. `stopped` is set then. `hold_reply(marker)`: the first reply chunk holding every
    part of `marker` (and every later reply on its connection) waits until `release()`; `held` is set
    once it waits."""

    def __init__(self, upstream_url: str) -> None:
        url = urlparse(upstream_url)
        if url.scheme == "unix":
            self.upstream: tuple = (socket.AF_UNIX, url.path)
            self.db = parse_qs(url.query).get("db", ["0"])[0]
        else:
            self.upstream = (socket.AF_INET, (url.hostname, url.port or 6379))
            self.db = (url.path or "/0").lstrip("/") or "0"
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.marker: tuple[bytes, ...] | None = None
        self.where = ""
        self.stopped = threading.Event()
        self.reply_marker: tuple[bytes, ...] | None = None
        self.held = threading.Event()
        self.released = threading.Event()
        self.closing = False
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/{self.db}"

    def stop_at(self, marker: tuple[bytes, ...], where: str) -> None:
        self.where, self.marker = where, marker

    def hold_reply(self, marker: tuple[bytes, ...]) -> None:
        self.held.clear()
        self.released.clear()
        self.reply_marker = marker

    def release(self) -> None:
        self.reply_marker = None
        self.released.set()

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.socket(self.upstream[0], socket.SOCK_STREAM)
            server.connect(self.upstream[1])
            self.sockets += [client, server]
            muted = threading.Event()  # this connection's replies no longer reach its client
            threading.Thread(target=self._up, args=(client, server, muted), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, muted), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, muted: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                marker = self.marker
                if marker is not None and not self.stopped.is_set() and all(p in chunk for p in marker):
                    if self.where == "reply":
                        muted.set()
                        server.sendall(chunk)
                    self.stopped.set()
                    while client.recv(65536):  # the connection hangs from here on
                        pass
                    return
                server.sendall(chunk)

    def _down(self, server: socket.socket, client: socket.socket, muted: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := server.recv(65536):
                marker = self.reply_marker
                if marker is not None and not self.held.is_set() and all(p in chunk for p in marker):
                    self.held.set()
                    self.released.wait(30)  # (the connection's later replies queue behind it, in order)
                if not muted.is_set():
                    client.sendall(chunk)

    def close(self) -> None:
        self.closing = True
        self.released.set()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
