"""The floor of bench/http_gateway.py's `empty` scenario: the smallest ASGI app, an empty 200 answer to any
request. What uvicorn and the client cost per request on this machine, with no framework and no broker."""

from __future__ import annotations

from typing import Any

_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"text/plain"), (b"content-length", b"0")]}
_BODY = {"type": "http.response.body", "body": b""}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send(_START)
    await send(_BODY)
