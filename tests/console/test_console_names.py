"""Destinations whose names hold characters with a meaning in a URL path (`/`, `%`, `#`, non-ASCII), in the
console, in Debian's headless Chromium against a live gateway (uvicorn): reached from the destination list,
their pages and actions act on them and on nothing else (gateway/paths.py; docs/console.md).

Broker state is made and checked with broker_core directly; the console is driven only through the browser."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from broker_core.messages import Message
from tests.console.conftest import PASSWORD
from tests.console.test_console import confirm, wait_for

pytestmark = pytest.mark.e2e

SPECIAL = {"slash": "orders/eu", "percent": "100%2F", "hash": "a#b", "non-ascii": "café/ü",
           "sub-resource": "x/purge"}


@pytest.mark.parametrize("special", SPECIAL.values(), ids=SPECIAL.keys())
def test_a_queue_named_with_url_characters_is_browsed_moved_purged_and_deleted(
        admin_page, console_server, broker, queue_name, special):
    name = f"{queue_name}.{special}"
    neighbour = f"{queue_name}.{special.split('/')[0]}" if "/" in special else None
    moved_to = f"{queue_name}.moved/{special}"
    ids = broker.send(name, [Message(body=f"m{i}") for i in range(3)])
    broker.ensure_destination(moved_to)  # (a move does not create its target)
    if neighbour:  # `….x` beside `….x/purge`: nothing done to the one touches the other
        broker.send(neighbour, Message(body="bystander"))
    page = admin_page

    page.goto(f"{console_server.url}/console/destinations/?search={quote(queue_name)}")
    page.locator("#destinations a", has_text=name).first.click()
    expect(page.locator("h1")).to_contain_text(name)
    expect(page.locator("[data-stat=queue_size]")).to_have_text("3")

    page.get_by_role("link", name="Browse messages").click()
    expect(page.locator("#messages tbody tr")).to_have_count(3)
    page.get_by_label(f"Select {ids[0]}").check()
    page.fill("#bulk-target", moved_to)
    page.get_by_role("button", name="Move selected").click()
    confirm(page)
    expect(page.locator("#toast")).to_contain_text("Move: 1 messages")
    wait_for(lambda: broker.stats(moved_to).queue_size == 1)

    page.locator("#messages td.id a").get_by_text(ids[1], exact=True).click()  # (has_text ignores case)
    expect(page.locator("#headers tr", has_text="Message id")).to_be_visible()
    page.locator(".crumbs a", has_text=name).click()  # the breadcrumb back to the queue's page
    expect(page.locator("[data-stat=queue_size]")).to_have_text("2")

    page.click("#purge")
    confirm(page)
    wait_for(lambda: broker.stats(name).queue_size == 0)
    page.click("#delete")
    confirm(page)
    page.wait_for_url(f"{console_server.url}/console/destinations/")
    wait_for(lambda: f"queue://{name}" not in broker.destinations())
    assert broker.stats(moved_to).queue_size == 1
    if neighbour:
        assert broker.stats(neighbour).queue_size == 1


def test_a_topic_named_with_a_slash_has_its_page(admin_page, console_server, broker, queue_name):
    name = f"{queue_name}.prices/eu"
    broker.send(f"topic://{name}", Message(body="tick"))
    page = admin_page
    page.goto(f"{console_server.url}/console/topics/{quote(name, safe='')}/")
    expect(page.locator("h1")).to_contain_text(name)
    expect(page.locator("[data-stat=enqueued]")).to_have_text("1")


def test_logging_in_returns_to_the_page_of_a_queue_named_with_a_slash(chromium, console_server, broker,
                                                                       queue_name):
    name = f"{queue_name}.orders/eu"
    broker.send(name, Message(body="x"))
    context = chromium.new_context()
    try:
        page = context.new_page()
        url = f"{console_server.url}/console/queues/{quote(name, safe='')}/"
        page.goto(url)
        page.fill("#id_username", "admin")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(url)
        expect(page.locator("[data-stat=queue_size]")).to_have_text("1")
    finally:
        context.close()
