"""A message an HTTP answer carries is settled once that answer has been written, never before.

An answer that carries leased messages (ActiveMQ's /api/message GET, gateway/api/compat.py; the native
API's receive for an ack-mode-auto consumer, views_messaging.receive_messages) is built by the view, or by
its lean path (compat_hot.py, hot_path.py), and written by the ASGI handler (asgi.py). Acknowledging
before the write loses the message when the process dies between the two: acknowledged, never received.
So the view only hands the handler the settlement with the answer (`hand_over`, `defer`; a DRF Response
rendered into a plain one takes its settlement along, `rendered_as`), and the handler calls
`finish` once the answer's last body chunk has been sent (`http.response.body` without more_body
returned): the message is acknowledged only then. A process that dies between the write and the
settlement leaves the message leased, and the lease gives it back (redelivered): at least once.

When the answer handed over is not the one written (a middleware replaced it, the request was cancelled,
the write failed), `finish` gives the message back instead. Both the lean path and Django's call `finish`
with the object whose bytes they wrote: the rule exists once, here.

Nor is an answer written when its client has gone: uvicorn's `send` (httptools and h11 alike, `run`'s
server) returns without a word once the connection is lost, its request cycle marked `disconnected`, so a
long poll whose client gave up as its message arrived, or a lean path's answer whose client closed while
the message was being leased, would be acknowledged and never received. `finish` asks `dropped(receive)`:
that mark, read from the request cycle the server's `receive` belongs to, right after the last chunk was
sent. It is exact: uvicorn sets it only on a connection lost before the answer was complete, so set then,
the answer's body was never written; unset, the whole answer went to the socket. It costs two attribute
reads, and only for an answer that carries a message. The ASGI way, watching `receive` for
`http.disconnect`, tells less: the event reaches a listener a turn of the loop after uvicorn marks the
cycle (the answer may be dropped in between), uvicorn also answers `http.disconnect` once the answer is
complete (written or not), and the lean paths would need a listener task on every request. A server
that raises from `send` on a closed connection (the OSError the ASGI spec now asks for; uvicorn's HTTP
`send` does not) has the answer counted not written too; one that does neither cannot be told apart from
a written answer. What is left: an answer written to a socket whose peer closed a moment before, the
server not having seen it yet, goes to the kernel and is acknowledged, then lost with the connection,
as one whose client dies after it arrived and before it was read: no server learns whether an HTTP
answer was read.

A request cancelled by Django's handler because its client left (a long poll) gives back what it took:
a message handed over is given back by `finish` (the answer never written); one leased by a call the
cancellation interrupted is given back by its caller once the call returns (views_messaging.long_poll's
receive, compat._begin_cancellable's turn). A client gone just before the write (uvicorn's mark set, the
handler's listener not yet woken to cancel) is caught by `dropped`, as on the lean paths, which are never
cancelled (nothing listens for their client leaving).

Giving back is a `nack`, as a JMS consumer's rollback: the message comes back after the policy's
redelivery delay with its redelivery counter raised (to the dead-letter queue past maximumRedeliveries),
though the client never saw it. ActiveMQ would not count a message it knows never reached the
application (a prefetched one, returned on close), but this broker's mark of what a consumer received is
one dispatch sequence per consumer, already past a pulled message, and lowering it would unmark messages
a concurrent receive handed to the client. Counting one more redelivery errs towards "may have been
seen", as JMSRedelivered means.

Within one process a queue consumer's settlement is written to Redis synchronously when `finish` is
awaited, before the event loop can read the client's next request (the broker's multiplexed connection,
broker_core/drivers/multiplexed.py, keeps a process's commands in order): Redis runs the settlement first.
A topic consumer's takes more than one round trip (its subscription is looked up first), and a next
request may reach another process: for those the turn's short retry before a 409 covers the gap
(compat.TURN_RETRY_PAUSES_S).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# the scope's slot: the handlers serving a request make it (`open_slot`); `defer` fills it
KEY = "signalbox.unsettled"


@dataclass(slots=True)
class Unsettled:
    """The answer carrying a leased message, and what to do once it is written, or if it is not."""

    answer: Any  # the object the handler writes (Django's HttpResponse, or the lean path's tuple)
    settle: Callable[[], Awaitable[None]]  # written: acknowledge
    give_back: Callable[[], Awaitable[None]]  # not written: nack


def open_slot(scope: dict[str, Any]) -> None:
    """Say this request is served by a handler that calls `finish` (asgi.GatewayASGIHandler)."""
    scope[KEY] = None


def defer(scope: dict[str, Any], unsettled: Unsettled) -> None:
    """Hand the settlement of `unsettled.answer`'s message to the handler that writes it. Raises (the caller
    gives the message back) when no such handler serves the request: nothing would settle it."""
    if KEY not in scope:
        raise RuntimeError("an answer carrying a message must be written by GatewayASGIHandler, which "
                           "settles it once written")
    if scope[KEY] is not None:
        raise RuntimeError("one answer carries one leased message")
    scope[KEY] = unsettled


def rendered_as(scope: dict[str, Any] | None, answer: Any, plain: Any) -> None:
    """`answer` is written as `plain` (its rendering, gateway.api.base.rendered): its settlement follows."""
    unsettled = scope.get(KEY) if scope is not None else None
    if unsettled is not None and unsettled.answer is answer:
        unsettled.answer = plain


async def hand_over(scope: dict[str, Any], build: Callable[[], Any], settle: Callable[[], Awaitable[None]],
                    give_back: Callable[[], Awaitable[None]]) -> Any:
    """`build()` the answer carrying leased messages and `defer` their settlement to the handler that writes
    it; the answer. If building fails (or the request is cancelled), they are given back now."""
    try:
        answer = build()
        defer(scope, Unsettled(answer, settle, give_back))
    except BaseException:
        await asyncio.shield(give_back())
        raise
    return answer


def dropped(receive: Any) -> bool:
    """Whether the server dropped the answer just sent, its client gone (module docstring): the mark of
    uvicorn's request cycle, whose bound method the server's `receive` is (a wrapper of it, such as a handler
    replaying a request's body, names it `__wrapped__`)."""
    cycle = getattr(receive, "__self__", None)
    while cycle is None and (receive := getattr(receive, "__wrapped__", None)) is not None:
        cycle = getattr(receive, "__self__", None)
    return getattr(cycle, "disconnected", False) is True


async def finish(scope: dict[str, Any], written: Any, receive: Any = None) -> None:
    """The request's answer is out (`written`: the object whose last body chunk was sent to the server whose
    channel `receive` is) or will never be (None): settle the message it carries, or give back the one handed
    over with an answer not written, or dropped by the server because the client had gone (`dropped`).
    Called by the handler right after the write, and again at the end of the request (then a no-op)."""
    unsettled = scope.get(KEY)
    if unsettled is None:
        return
    scope[KEY] = None
    if written is not None and written is unsettled.answer and not dropped(receive):
        try:
            await unsettled.settle()
            return
        except Exception:  # noqa: BLE001 - the answer is out: nothing to tell the client, the message goes back
            log.warning("a written answer's message could not be acknowledged; it is given back",
                        exc_info=True)
    try:
        await asyncio.shield(unsettled.give_back())
    except Exception:  # noqa: BLE001 - still leased: the lease gives it back
        log.warning("an unwritten answer's message could not be given back; its lease will", exc_info=True)
