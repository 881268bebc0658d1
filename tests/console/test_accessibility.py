"""Every console page passes axe-core's WCAG 2 A and AA rules in the light and the dark theme (issue 26,
item 10), at laptop and phone widths, and the scrollable regions (the events log) scroll from the keyboard.

The pages are listed from console/urls.py, so a new page is checked without touching this file: each
route's parameters are filled from PARAMETERS (a queue and a topic both named NAME exist, with messages,
consumers, a message group, a dead letter and events). A route that is not an HTML page is named in
NOT_PAGES with the reason. axe-core comes from npm (package.json); Playwright injects
node_modules/axe-core/axe.min.js into each page and runs axe.run with the WCAG 2 A/AA tags. A failure
prints every violation: its rule, the nodes (selector and HTML) and, for contrast, the two colours and the
ratio against the one required."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.urls import URLPattern, URLResolver, reverse
from playwright.sync_api import expect

from broker_core.broker import Broker
from broker_core.connections import ConnectionRecord
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from console import urls as console_urls
from tests.console.conftest import login
from tests.helpers.gateway_server import ROOT

pytestmark = pytest.mark.e2e

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
NAME = f"a11y.{uuid.uuid4().hex[:8]}"
NOT_PAGES = {"logout": "a POST that logs out and redirects",
             "analytics-summary": "JSON for the analytics page"}
LOGGED_OUT = {"login"}
DESKTOP, PHONE = {"width": 1366, "height": 900}, {"width": 390, "height": 844}


def console_routes() -> list[tuple[str, list[str]]]:
    """(route name, its parameter names) for every route of console/urls.py."""
    out = []
    for entry in console_urls.urlpatterns:
        assert isinstance(entry, URLPattern) and not isinstance(entry, URLResolver), entry
        out.append((entry.name, list(entry.pattern.converters)))
    return out


ROUTES = [r for r in console_routes() if r[0] not in NOT_PAGES]


@pytest.fixture(scope="module")
def state(console_server, redis_url) -> Iterator[dict[str, str]]:
    """A queue and a topic named NAME with what the pages show: messages in a group, two consumers (one
    with messages in flight), a durable subscription offline, a poison message dead-lettered, and a
    registered connection subscribed to the queue and sending to it."""
    client = redis.Redis.from_url(redis_url)
    broker = Broker(client, console_server.namespace)
    queue, topic = NAME, f"topic://{NAME}"
    ids = broker.send(queue, [Message(body=f'{{"n": {i}}}', group_id=f"g{i % 3}") for i in range(40)])
    first = broker.add_consumer(queue, ConsumerSpec(client_id="a11y-app", prefetch=3, lease_ms=600_000,
                                                    ack_mode="client-individual"))
    broker.add_consumer(queue, ConsumerSpec(client_id="a11y-app", prefetch=2, lease_ms=600_000,
                                            ack_mode="client-individual"))
    delivered = broker.receive(first, 3)
    broker.nack(first, delivered[0].message_id, poison=True)  # a dead letter with its cause
    durable = broker.add_consumer(topic, ConsumerSpec(client_id="a11y-app", subscription_name="audit",
                                                      lease_ms=600_000))
    broker.close_consumer(durable)
    broker.send(topic, [Message(body="t")])
    connection = ConnectionRecord(f"a11y-{NAME}", "stomp+tcp", "a11y-process", user="admin",
                                  client_id="a11y-app", address="tcp://127.0.0.1:40000",
                                  since_ms=int(time.time() * 1000))
    connection.subscribed("s1", [f"queue://{queue}"], ack_mode="client", selector=None, prefetch=3,
                          consumer_ids=[first.consumer_id])
    connection.sent(f"queue://{queue}", 1, int(time.time() * 1000))
    broker.connection_put(connection, lease_ms=600_000)
    yield {"name": NAME, "kind": "queue", "message_id": ids[-1], "connection_id": connection.connection_id}
    client.close()


def url_of(route: str, parameters: list[str], state: dict[str, str]) -> str:
    missing = [p for p in parameters if p not in state]
    assert not missing, f"console route {route!r} has parameters {missing}: give them a value in `state`"
    return reverse(f"console:{route}", kwargs={p: state[p] for p in parameters})


def describe(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        lines.append(f"{v['id']} ({v['impact']}): {v['help']}")
        for node in v["nodes"][:15]:
            lines.append(f"  {' '.join(node['target'])}  {node['html'][:140]}")
            for check in node["any"] + node["all"]:
                d = check.get("data") or {}
                if isinstance(d, dict) and "contrastRatio" in d:
                    lines.append(f"    {d.get('fgColor')} on {d.get('bgColor')}: {d.get('contrastRatio')}:1, "
                                 f"needs {d.get('expectedContrastRatio')} ({d.get('fontSize')}, "
                                 f"{d.get('fontWeight')})")
        if len(v["nodes"]) > 15:
            lines.append(f"  ... and {len(v['nodes']) - 15} more")
    return "\n".join(lines)


def axe_violations(page) -> list[dict[str, Any]]:
    page.add_script_tag(path=str(AXE))
    return page.evaluate("(tags) => axe.run(document, {runOnly: {type: 'tag', values: tags}})"
                         ".then((r) => r.violations)", TAGS)


def settle(page) -> None:
    """Wait for the page's data: the feed is live and the tables are filled (no request pending)."""
    page.wait_for_load_state("networkidle")
    if page.locator("#live").count():
        expect(page.locator("#live")).to_have_attribute("data-state", "connected")
    page.wait_for_timeout(300)


@pytest.fixture(scope="module", params=["light", "dark"])
def themed(request, chromium, console_server) -> Iterator[tuple[str, Any]]:
    page = login(chromium, console_server, "admin", color_scheme=request.param)
    yield request.param, page
    page.context.close()


def test_every_console_route_is_checked_or_named_as_no_page():
    names = {name for name, _ in console_routes()}
    assert set(NOT_PAGES) <= names, "NOT_PAGES names a route console/urls.py no longer has"
    assert {"overview", "destinations", "queue", "login"} <= {name for name, _ in ROUTES}


@pytest.mark.parametrize("route", [name for name, _ in ROUTES])
def test_the_page_has_no_wcag_a_or_aa_violations(route, themed, state, chromium, console_server):
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `npm ci` (package.json lists axe-core)")
    theme, page = themed
    parameters = dict(ROUTES)[route]
    url = f"{console_server.url}{url_of(route, parameters, state)}"
    if route in LOGGED_OUT:
        context = chromium.new_context(color_scheme=theme)
        page = context.new_page()
    try:
        response = page.goto(url)
        assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"
        assert response.headers["content-type"].startswith("text/html"), (
            f"{route} is not an HTML page: add it to NOT_PAGES with the reason")
        settle(page)
        violations = axe_violations(page)
        assert not violations, f"{route} ({theme} theme), {url}:\n{describe(violations)}"
        page.set_viewport_size(PHONE)  # the same page laid out for a phone (tables scroll sideways)
        page.wait_for_timeout(200)
        violations = axe_violations(page)
        assert not violations, f"{route} ({theme} theme, phone width), {url}:\n{describe(violations)}"
    finally:
        page.set_viewport_size(DESKTOP)
        if route in LOGGED_OUT:
            context.close()


def test_the_events_log_scrolls_from_the_keyboard(admin_page, console_server, state, broker):
    page = admin_page
    page.goto(f"{console_server.url}/console/queues/{NAME}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "connected")
    log = page.locator("#events-box")
    for batch in range(4):  # the feed lists the events it tails from now on, at most 20 a batch
        broker.send(NAME, [Message(body=f"{batch}.{i}") for i in range(15)])
        page.wait_for_timeout(600)
    page.wait_for_function("() => { const e = document.querySelector('#events-box');"
                           " return e && e.scrollHeight > e.clientHeight; }")
    # reached with Tab like any control (not only by a script's focus())
    page.locator("#events-title").click()
    for _ in range(80):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.id") == "events-box":
            break
    assert page.evaluate("() => document.activeElement.id") == "events-box", "Tab never reaches the log"
    before = log.evaluate("(e) => e.scrollTop")
    page.keyboard.press("PageDown")
    page.wait_for_function("(b) => document.querySelector('#events-box').scrollTop > b", arg=before)


def test_the_destination_lists_menu_dialog_and_phone_layout_have_no_violations(themed, state, console_server,
                                                                               broker):
    theme, page = themed
    page.goto(f"{console_server.url}/console/destinations/?search={NAME}")
    settle(page)
    row = page.locator(f'#destinations tr[data-uri="queue://{NAME}"]')
    row.get_by_text("Actions").click()
    expect(row.locator(".menu-items")).to_be_visible()
    violations = axe_violations(page)
    assert not violations, f"destinations, Actions menu open ({theme}):\n{describe(violations)}"
    row.get_by_role("button", name="Purge…").click()
    expect(page.locator("dialog#confirm")).to_be_visible()
    violations = axe_violations(page)
    assert not violations, f"destinations, confirmation open ({theme}):\n{describe(violations)}"
    page.keyboard.press("Escape")  # cancelled: nothing purged
    expect(page.locator("dialog#confirm")).to_be_hidden()
    assert broker.stats(NAME).queue_size > 0
    page.set_viewport_size(PHONE)
    try:
        page.reload()
        settle(page)
        violations = axe_violations(page)
        assert not violations, f"destinations at phone width ({theme}):\n{describe(violations)}"
    finally:
        page.set_viewport_size(DESKTOP)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_refusal_page_a_reader_meets_has_no_violations(theme, chromium, console_server):
    page = login(chromium, console_server, "reader", color_scheme=theme)
    try:
        response = page.goto(f"{console_server.url}/console/audit/")
        assert response is not None and response.status == 403
        settle(page)
        violations = axe_violations(page)
        assert not violations, f"403 page ({theme}):\n{describe(violations)}"
    finally:
        page.context.close()
