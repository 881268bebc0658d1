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
