"""A queue browser's walk (Link.browse) against a stand-in broker: it takes the next page only once the last
one is delivered, so a client that does not read (its send buffer full: `deliver` waits) holds back the
walk instead of making the gateway take the whole queue; and it ends with `browsed` once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from broker_core.destinations import parse_destination
from broker_core.model import Browsed, BrowsePage
from gateway.ws.link import Link, LinkSettings

PAGE = 10


class PagedBroker:
    """browse() in pages over `total` messages, counting the calls."""

    def __init__(self, total: int, limit: int = 400) -> None:
        self.total, self.limit, self.calls = total, limit, 0

    async def ensure_destination(self, dest) -> None:
        pass

    async def browser_limit(self, dest, connection_id) -> int:
        return self.limit

    async def open_browser(self, dest, browser_id, lease_ms, prefetch, selector) -> None:
        pass

    async def close_browsers(self, dest, browser_ids, reason) -> int:
        return len(browser_ids)

    async def browse(self, dest, *, selector, cursor, limit, parked, examine) -> BrowsePage:
        assert parked is False and limit <= PAGE
        self.calls += 1
        start = int(cursor or 0)
        end = min(self.total, start + limit)
        messages = [Browsed(SimpleNamespace(message_id=f"ID:{n}", body=str(n)), "pending")  # type: ignore[arg-type]
                    for n in range(start, end)]
        return BrowsePage(messages, str(end) if end < self.total else None, len(messages))


async def test_the_walk_waits_for_each_page_to_be_delivered_and_ends_once():
    broker = PagedBroker(1000)
    gate = asyncio.Event()
    delivered: list[str] = []
    ended: list[str] = []

    async def deliver(sub, consumer, deliveries) -> None:
        await gate.wait()  # a full send buffer: SendBuffer.put waits
        delivered.extend(d.body for d in deliveries)

    async def browsed(sub) -> None:
        ended.append(sub.key)

    async def lost(reason, unavailable) -> None:
        raise AssertionError(reason)

    link = Link(broker, hub=None, deliver=deliver, lost=lost, settings=LinkSettings(browse_page=PAGE),
                browsed=browsed)
    sub = await link.browse("b", parse_destination("queue://q"), None, "auto", {"id": "b"})
    link.start(sub)
    for _ in range(50):
        await asyncio.sleep(0)
    assert broker.calls == 1 and delivered == [] and ended == []  # one page held, no more taken
    gate.set()
    for _ in range(200):
        await asyncio.sleep(0)
        if ended:
            break
    assert delivered == [str(n) for n in range(400)]  # the policy's maxBrowsePageSize
    assert broker.calls == 400 // PAGE and ended == ["b"]
    assert "b" in link.subscriptions  # it stays until UNSUBSCRIBE
    await link.unsubscribe("b")
