"""Waiting for what servers do in the background (a lease lapsing, a connection's clean-up), by polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """`check()`'s first truthy value, polled every 50 ms; AssertionError if none comes within `timeout`
    seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def flooded_until_cut_off(send: Callable[[bytes], None], request: bytes, times: int,
                          consumers: Callable[[], int]) -> None:
    """Send `request` `times` times reading no answer (the server may cut the connection off meanwhile:
    the send's OSError ends the flood), then wait until `consumers()` is 0: a client too slow to read its
    answers was cut off and its consumer closed."""
    try:
        for _ in range(times):
            send(request)
    except OSError:
        pass
    eventually(lambda: consumers() == 0, timeout=20)
