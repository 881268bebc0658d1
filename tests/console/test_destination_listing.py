"""The destination list's density and filters in Debian's headless Chromium (issue 26, item 7): the
filters for kind, messages, consumers and dead-letter queues run on the server and live in the URL (a view
can be shared), a page jump, a row's actions in its menu (no row of red buttons), compact rows at
1366x768 and a usable list at phone width."""

from __future__ import annotations

import time
import uuid

import pytest
from playwright.sync_api import expect

from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from tests.console.conftest import login
from tests.console.test_console import confirm

pytestmark = pytest.mark.e2e


@pytest.fixture
def prefix() -> str:
    return f"dl{uuid.uuid4().hex[:8]}"


def seed(broker, prefix: str) -> dict[str, str]:
    """busy (messages and a consumer), idle (messages, no consumer), served (a consumer, no message),
    empty, and a dead-letter queue DLQ.<prefix>.busy with a message."""
    names = {k: f"{prefix}.{k}" for k in ("busy", "idle", "served", "empty")}
    broker.add_consumer(names["busy"], ConsumerSpec(prefetch=0, lease_ms=600_000))
    broker.send(names["busy"], [Message(body="a"), Message(body="b")])
    broker.send(names["idle"], [Message(body="c")] * 3)
    broker.add_consumer(names["served"], ConsumerSpec(prefetch=0, lease_ms=600_000))
    broker.ensure_destination(names["empty"])
    names["dlq"] = f"DLQ.{prefix}.busy"
    broker.send(names["dlq"], Message(body="dead"))
    return names


def expect_rows(page, uris: list[str], timeout: float = 15.0) -> None:
    """The table shows exactly these rows, in this order (waiting for the load the last change started)."""
    deadline = time.monotonic() + timeout
    while True:
        shown = page.locator("#destinations tbody tr[data-uri]").evaluate_all(
            "(rows) => rows.map((r) => r.dataset.uri)")
        if shown == uris:
            return
        assert time.monotonic() < deadline, f"rows {shown}, expected {uris}, at {page.url}"
        page.wait_for_timeout(100)


def test_filters_run_on_the_server_and_a_shared_link_opens_the_same_view(admin_page, console_server, broker,
                                                                          prefix):
    names = seed(broker, prefix)
    page = admin_page
    page.goto(f"{console_server.url}/console/destinations/?search={prefix}")
    expect(page.locator("#dest-count")).to_have_text("1–5 of 5")
    # Messages: waiting; Consumers: none -> the backlog nobody consumes (a DLQ is one too)
    page.select_option("#f-messages", "true")
    page.select_option("#f-consumers", "false")
    expect_rows(page, [f"queue://{names['dlq']}", f"queue://{names['idle']}"])  # by name: DLQ. < dl
    expect(page.locator("#dest-count")).to_have_text("1–2 of 2")
    page.select_option("#f-dlq", "false")
    expect_rows(page, [f"queue://{names['idle']}"])
    expect(page.locator("#dest-count")).to_have_text("1–1 of 1")
    for part in ("non_empty=true", "has_consumers=false", "dlq=false", f"search={prefix}"):
        assert part in page.url
    # the link, opened in another browser context, shows the same view with the controls set
    shared = page.url
    other = page.context.browser.new_context()
    try:
        other_page = login(page.context.browser, console_server, "admin")
        other_page.goto(shared)
        expect(other_page.locator("#dest-count")).to_have_text("1–1 of 1")
        expect(other_page.locator("#f-messages")).to_have_value("true")
        expect(other_page.locator("#f-consumers")).to_have_value("false")
        expect(other_page.locator("#f-dlq")).to_have_value("false")
        expect(other_page.locator("#search")).to_have_value(prefix)
        other_page.context.close()
    finally:
        other.close()
    # only the dead-letter queues; then with consumers; Clear filters keeps the name
    page.select_option("#f-messages", "")
    page.select_option("#f-consumers", "")
    page.select_option("#f-dlq", "true")
    expect_rows(page, [f"queue://{names['dlq']}"])
    page.select_option("#f-dlq", "")
    page.select_option("#f-consumers", "true")
    expect_rows(page, [f"queue://{names['busy']}", f"queue://{names['served']}"])
    page.select_option("#f-messages", "false")
    expect_rows(page, [f"queue://{names['served']}"])
    page.click("#clear")  # the selects; the name stays
    expect(page.locator("#dest-count")).to_have_text("1–5 of 5")
    assert "has_consumers" not in page.url and "non_empty" not in page.url and f"search={prefix}" in page.url


def test_a_page_number_jumps_there_and_is_kept_in_the_url(admin_page, console_server, broker, prefix):
    for i in range(60):
        broker.ensure_destination(f"{prefix}.{i:02d}")
    page = admin_page
    page.goto(f"{console_server.url}/console/destinations/?search={prefix}&limit=25")
    expect(page.locator("#dest-count")).to_have_text("1–25 of 60")
    expect(page.locator("#page-count")).to_have_text("3")
    expect(page.locator("#first")).to_be_disabled()
    page.fill("#page-no", "3")
    page.press("#page-no", "Enter")
    expect(page.locator("#dest-count")).to_have_text("51–60 of 60")
    expect(page.locator("#destinations tbody th").first).to_have_text(f"{prefix}.50")
    assert "page=3" in page.url and "offset" not in page.url
    expect(page.locator("#last")).to_be_disabled()
    page.click("#first")
    expect(page.locator("#dest-count")).to_have_text("1–25 of 60")
    page.click("#last")
    expect(page.locator("#dest-count")).to_have_text("51–60 of 60")
    page.fill("#page-no", "99")  # past the end: the last page
    page.press("#page-no", "Enter")
    expect(page.locator("#page-no")).to_have_value("3")
    page.goto(f"{console_server.url}/console/destinations/?search={prefix}&limit=25&page=2")
    expect(page.locator("#dest-count")).to_have_text("26–50 of 60")
    expect(page.locator("#page-no")).to_have_value("2")


def test_a_rows_actions_are_in_its_menu_and_purge_still_asks_first(admin_page, console_server, broker,
                                                                  queue_name):
    broker.send(queue_name, [Message(body="x")] * 4)
    page = admin_page
    page.goto(f"{console_server.url}/console/destinations/?search={queue_name}")
    row = page.locator(f'#destinations tr[data-uri="queue://{queue_name}"]')
    expect(row).to_have_count(1)
    expect(row.locator("button:visible")).to_have_count(0)  # no button on the row until the menu opens
    row.get_by_text("Actions").click()
    menu = row.locator(".menu-items")
    expect(menu).to_be_visible()
    assert menu.locator("a, button").all_inner_texts() == ["Browse", "Send", "Pause", "Purge…", "Delete…"]
    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    # from the keyboard: Enter opens the menu, Tab walks its items
    row.locator("summary").focus()
    page.keyboard.press("Enter")
    expect(menu).to_be_visible()
    page.keyboard.press("Tab")
    expect(menu.get_by_role("link", name="Browse")).to_be_focused()
    menu.get_by_role("button", name="Purge…").click()
    confirm(page)
    expect(page.locator("#toast")).to_contain_text("Purge: done")
    assert broker.stats(queue_name).queue_size == 0


def test_a_reader_finds_only_browse_in_the_menu(reader_page, console_server, broker, queue_name):
    broker.send(queue_name, Message(body="x"))
    page = reader_page
    page.goto(f"{console_server.url}/console/destinations/?search={queue_name}")
    row = page.locator(f'#destinations tr[data-uri="queue://{queue_name}"]')
    row.get_by_text("Actions").click()
    assert row.locator(".menu-items a, .menu-items button").all_inner_texts() == ["Browse"]


def test_rows_are_compact_at_1366x768(chromium, console_server, broker, prefix):
    for i in range(40):
        broker.ensure_destination(f"{prefix}.{i:02d}")
    page = login(chromium, console_server, "admin", viewport={"width": 1366, "height": 768})
    try:
        page.goto(f"{console_server.url}/console/destinations/?search={prefix}")
        expect(page.locator("#dest-count")).to_have_text("1–40 of 40")
        visible = page.locator("#destinations tbody tr").evaluate_all(
            "(rows) => rows.filter((r) => r.getBoundingClientRect().bottom <= innerHeight).length")
        layout = page.evaluate("() => ['header', 'h1', '.toolbar', '#destinations thead'].map((s) =>"
                               " `${s}: ${Math.round(document.querySelector(s)"
                               ".getBoundingClientRect().bottom)}`)")
        print(f"{visible} rows fully on a 1366x768 screen; bottoms at {layout}")
        assert visible >= 25, f"{visible} rows on a 1366x768 screen; bottoms at {layout}"  # 13 before
        heights = page.locator("#destinations tbody tr").evaluate_all(
            "(rows) => rows.map((r) => r.getBoundingClientRect().height)")
        assert max(heights) < 30, heights  # one line each
    finally:
        page.context.close()


def test_at_phone_width_the_list_is_cards_without_sideways_scrolling(chromium, console_server, broker,
                                                                     prefix):
    names = seed(broker, prefix)
    page = login(chromium, console_server, "admin", viewport={"width": 390, "height": 844})
    try:
        page.goto(f"{console_server.url}/console/destinations/?search={prefix}")
        expect(page.locator("#dest-count")).to_have_text("1–5 of 5")
        assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
        row = page.locator(f'#destinations tr[data-uri="queue://{names["idle"]}"]')
        name = row.locator("th a")
        expect(name).to_be_visible()
        pending = row.locator('td[data-col="messages"]')
        expect(pending).to_be_visible()
        assert pending.evaluate("(td) => getComputedStyle(td, '::before').content") == '"Pending"'
        assert pending.inner_text() == "3"
        box = row.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390
        # the filters are folded away so the list starts near the top; opened, they work as on a laptop
        expect(page.locator("#f-messages")).to_be_hidden()
        first = page.locator("#destinations tbody tr").first.bounding_box()
        assert first["y"] < 400, first
        page.get_by_text("Filters and sort").click()
        page.select_option("#ordering", "-messages")
        expect(page.locator("#destinations tbody th").first).to_contain_text(names["idle"])
        row.get_by_text("Actions").click()
        menu = row.locator(".menu-items")
        expect(menu).to_be_visible()
        mbox = menu.bounding_box()
        assert mbox["x"] >= 0 and mbox["x"] + mbox["width"] <= 390
        page.keyboard.press("Escape")
        page.select_option("#f-consumers", "true")
        expect(page.locator("#dest-count")).to_have_text("1–2 of 2")
        expect(page.locator("#filters-active")).to_have_text("(2 on)")  # the name and the consumers
    finally:
        page.context.close()


def test_a_destination_deleted_elsewhere_leaves_the_list_rather_than_keeping_its_figures(
        admin_page, console_server, broker, prefix):
    """The rows on screen are live: one deleted by someone else (or anything else) is not left with its
    last figures under a "Live" header; the list is read again without it, and says why."""
    kept, gone = f"{prefix}.kept", f"{prefix}.gone"
    broker.send(kept, [Message(body="k")])
    broker.send(gone, [Message(body=str(i)) for i in range(4)])
    page = admin_page
    page.goto(f"{console_server.url}/console/destinations/?search={prefix}")
    expect_rows(page, [f"queue://{gone}", f"queue://{kept}"])
    expect(page.locator("#live")).to_have_attribute("data-state", "connected")
    broker.delete_destination(gone)
    expect_rows(page, [f"queue://{kept}"], timeout=6)
    expect(page.locator("#dest-count")).to_have_text("1–1 of 1")
    expect(page.locator("#toast")).to_contain_text(f"{gone} no longer exists")


def test_a_queue_paused_elsewhere_reads_paused_in_the_list_without_a_reload(admin_page, console_server,
                                                                            broker, prefix):
    """The rows' figures were live but the paused badge and the menu's Pause / Resume were not: a queue
    paused by someone else (or the CLI) still read as dispatching, and offered Pause."""
    name = f"{prefix}.p"
    broker.send(name, [Message(body="x")])
    page = admin_page
    page.goto(f"{console_server.url}/console/destinations/?search={prefix}")
    row = page.locator(f'#destinations tr[data-uri="queue://{name}"]')
    expect(row).to_have_count(1)
    expect(row.locator(".badge")).to_have_count(0)
    broker.pause(name)
    expect(row.locator(".badge")).to_contain_text("paused", timeout=6000)
    expect(row.locator("[data-op=resume]")).to_have_count(1)
    broker.resume(name)
    expect(row.locator(".badge")).to_have_count(0, timeout=6000)
    expect(row.locator("[data-op=pause]")).to_have_count(1)
