"""The largest WebSocket message a gateway reads, before and after its client logged in: /stomp and /ws/v1
on the web server (gateway/ws/uvicorn_ws.py) and the STOMP listener's WebSocket port
(gateway/stomp/ws_port.py).

websockets holds a message until its last byte, so a connection that has not logged in could otherwise
make the process hold 16 MiB, and each of the connections a process serves could. Until the session is
established (logged in: `LinkedSession.established`), a message may be as large as a STOMP frame within
the limits before CONNECT (a CONNECT or a JSON connect request is a few short fields); after, 16 MiB.
Beyond the protocol's own limits and under these, the protocol refuses with an error that names its
limit; past these, the close code 1009 ("message too big").
"""

from __future__ import annotations

MAX_MESSAGE = 16 * 1024 * 1024  # bytes: the largest WebSocket message read (uvicorn's --ws-max-size default)
# bytes: a STOMP frame at the limits before CONNECT (gateway/stomp/frames.py BEFORE_CONNECT: a 64 KiB body,
# 32 header lines of 10 KiB) and 1 KiB to spare (a number here: gateway.stomp imports gateway.ws)
MAX_MESSAGE_BEFORE_LOGIN = 385 * 1024
