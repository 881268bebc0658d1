"""Redis, the broker's store, cannot be reached: how every adapter recognises it and what it says.

All three drivers (redis-py, broker_core's direct and multiplexed connections) raise redis-py's
ConnectionError or TimeoutError when Redis is down, restarting or still loading its AOF
(BusyLoadingError is a ConnectionError). The adapters map exactly these, in one place each: REST answers
503 with Retry-After (gateway/api/errors.describe), STOMP an ERROR and JSON WebSocket an error
`broker_unavailable` that end the connection (the client reconnects once Redis is back), the console's
live feed a `status` message, Django's own views a plain 503 (`gateway.api.errors.UnavailableMiddleware`).
Nothing else is retried or restarted: redis-py and the drivers open new connections on the next call.
"""

from __future__ import annotations

import redis
from django.conf import settings

STORE_ERRORS = (redis.ConnectionError, redis.TimeoutError)
CODE = "broker_unavailable"
TITLE = "Broker unavailable"


def store_unavailable(exc: BaseException) -> bool:
    return isinstance(exc, STORE_ERRORS)


def retry_after() -> int:
    """Seconds a client should wait before retrying (SIGNALBOX_UNAVAILABLE_RETRY_AFTER, default 1): the
    launcher restarts a crashed Redis after 0.5 s, and loading the AOF takes a moment more."""
    return max(1, int(getattr(settings, "SIGNALBOX_UNAVAILABLE_RETRY_AFTER", 1)))


def explain(exc: BaseException) -> str:
    """The client's explanation. The driver's own text names hosts and ports; it goes to the log only."""
    kind = "is loading its data" if isinstance(exc, redis.BusyLoadingError) else "cannot be reached"
    return (f"the broker is unavailable: its store (Redis) {kind} ({type(exc).__name__}); "
            f"retry in {retry_after()} s")
