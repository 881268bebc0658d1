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

Run uvicorn with `--ws gateway.ws.uvicorn_ws:WebSocketProtocol` (signalbox/launcher.py does). Under another
ASGI server, or uvicorn without it, the gateway counts a frame written once the server took it.
"""

from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

# the scope's extension: {"unsent": () -> int, "flush": async () -> bool} (gateway/consumers.py reads it)
SOCKET_WRITES = "signalbox.socket_writes"


class WebSocketProtocol(WebSocketsSansIOProtocol):
    lost = False  # the connection is gone: what the transport still holds will never leave

    async def run_asgi(self) -> None:
        # (here, not in connection_made: until the upgrade's handshake is handled the transport's protocol
        # is still uvicorn's HTTP one, which a pause would reach)
        self.transport.set_write_buffer_limits(high=0)
        extensions = self.scope.setdefault("extensions", {})
        assert extensions is not None
        extensions[SOCKET_WRITES] = {"unsent": self.unsent, "flush": self.flush}
        await super().run_asgi()

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
