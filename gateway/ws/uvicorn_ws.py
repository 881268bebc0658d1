"""uvicorn's WebSocket protocol, telling the application which bytes it sent are still in this process.

uvicorn's `websocket.send` (websockets' sans-I/O implementation, its default when websockets is installed)
hands the message's bytes to the asyncio transport and returns. The transport keeps what the kernel did not
take (its send buffer is full: the client reads slowly) and a process killed then loses them. The gateway
counts a frame written, and acknowledges an ack-mode-auto message, only once its bytes have left the
process (gateway/ws/link.py, SendBuffer `written`), so it must see them leave. This protocol sets the
transport's write-buffer limits to high=0, as STOMP over TCP does (gateway/stomp/tcp.py): the transport
pauses the protocol while it holds any byte and resumes it once it holds none, so uvicorn's own `writable`
event is set exactly when nothing is left to send (and uvicorn's send, which waits for it before it
writes, takes the next message only then). It offers the application `unsent()` and `flush()`, the pair
STOMP over TCP's transport has, in the scope's extensions under SOCKET_WRITES.

It also reads at most MAX_MESSAGE_BEFORE_LOGIN a message until the application says its client logged in
(gateway/ws/message_limits.py): the application hands a predicate to `logged_in` in the extension
MESSAGE_LIMIT, and the limit rises to uvicorn's --ws-max-size before the first message read after it
holds. The limit is set before the handshake is parsed, as a client may send frames right behind its
request.

Run uvicorn with `--ws gateway.ws.uvicorn_ws:WebSocketProtocol` (signalbox/launcher.py does). Under another
ASGI server, or uvicorn without it, the gateway counts a frame written once the server took it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway.ws.message_limits import MAX_MESSAGE_BEFORE_LOGIN

# the scope's extensions (gateway/consumers.py reads them): {"unsent": () -> int, "flush": async () -> bool}
SOCKET_WRITES = "signalbox.socket_writes"
# {"logged_in": (predicate: () -> bool) -> None}: once the predicate holds, messages up to --ws-max-size
MESSAGE_LIMIT = "signalbox.message_limit"


class WebSocketProtocol(WebSocketsSansIOProtocol):
    lost = False  # the connection is gone: what the transport still holds will never leave
    _logged_in: Callable[[], bool] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._largest = self.conn.max_message_size  # (--ws-max-size)
        if self._largest is None or self._largest > MAX_MESSAGE_BEFORE_LOGIN:
            self.conn.max_message_size = MAX_MESSAGE_BEFORE_LOGIN

    async def run_asgi(self) -> None:
        # (here, not in connection_made: until the upgrade's handshake is handled the transport's protocol
        # is still uvicorn's HTTP one, which a pause would reach)
        self.transport.set_write_buffer_limits(high=0)
        extensions = self.scope.setdefault("extensions", {})
        assert extensions is not None
        extensions[SOCKET_WRITES] = {"unsent": self.unsent, "flush": self.flush}
        extensions[MESSAGE_LIMIT] = {"logged_in": self.logged_in}
        await super().run_asgi()

    def logged_in(self, predicate: Callable[[], bool]) -> None:
        """Lift the message limit once `predicate` holds (checked as data arrives)."""
        self._logged_in = predicate

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        # (websockets takes a frame's limit when its first byte is read: lifted before these bytes go in)
        if conn.max_message_size != self._largest and self._logged_in is not None and self._logged_in():
            conn.max_message_size = self._largest
        super().data_received(data)

    def unsent(self) -> int:
        """Bytes sent that the transport still holds (the kernel's send buffer was full)."""
        return self.transport.get_write_buffer_size()

    async def flush(self) -> bool:
        """Wait until the transport holds none of the bytes sent; False when the connection is lost first."""
        await self.writable.wait()  # (set once the buffer is empty, or by connection_lost)
        return not self.lost and not self.transport.get_write_buffer_size()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        super().connection_lost(exc)
        # asyncio never resumes writing on a transport lost while paused (newer uvicorn sets it too)
        self.writable.set()
