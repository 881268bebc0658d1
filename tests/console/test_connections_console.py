"""The console's Connections page in Debian's headless Chromium against a live gateway and a STOMP-over-TCP
listener: a real STOMP client over TCP and one over WebSocket appear with their subscription and producer
rows, the queue page's consumers table links to the connection, and Close (admins, confirmed) ends the
client's connection with an ERROR and returns its unacknowledged message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.console.conftest import PASSWORD
from tests.console.test_console import confirm
from tests.helpers.gateway_server import spawn_stomp_listener, wait_listening
from tests.helpers.stomp_client import RawStomp, RawTcp

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stomp_tcp(console_server) -> Iterator[Any]:
    listener = wait_listening(spawn_stomp_listener(console_server.data_dir, console_server.namespace,
                                                   "console-stomp"))
    yield listener
    listener.stop()
    assert "Traceback" not in listener.output(), listener.output()


def consume_and_produce(client: Any, queue: str, audit: str, client_id: str) -> None:
    """Subscribe to `queue` (client-individual, a selector, prefetch 5), send twice to `audit`, and hold one
    message of `queue` unacknowledged."""
    client.connect(**{"client-id": client_id})
    client.send("SUBSCRIBE", {"id": "orders-sub", "destination": f"/queue/{queue}",
                              "ack": "client-individual", "selector": "kind = 'order'",
                              "activemq.prefetchSize": "5", "receipt": "r"})
    client.expect("RECEIPT")
    for n in range(2):
        client.send("SEND", {"destination": f"/queue/{audit}", "receipt": f"a{n}"}, b"audit")
        client.expect("RECEIPT")
    client.send("SEND", {"destination": f"/queue/{queue}", "kind": "order", "receipt": "q"}, b"held")
    client.expect("RECEIPT")
    assert client.expect("MESSAGE").body == b"held"


def check_detail(page: Any, protocol: str, client_id: str, queue: str, audit: str) -> None:
    expect(page.locator("#fields [data-field=protocol]")).to_have_text(protocol)
    expect(page.locator("#fields [data-field=client_id]")).to_have_text(client_id)
    expect(page.locator("#fields [data-field=user]")).to_have_text("admin")
    sub = page.locator("#subscriptions tbody tr[data-subscription='orders-sub']")
    expect(sub).to_contain_text(f"queue://{queue}")
    expect(sub).to_contain_text("client-individual")
    expect(sub).to_contain_text("kind = 'order'")
    expect(sub.locator("td").nth(4)).to_have_text("5")
    audit_row = page.locator(f"#producers tbody tr[data-producer='queue://{audit}']")
    expect(audit_row.locator("td").nth(1)).to_have_text("2", timeout=10_000)
    expect(page.locator(f"#producers tbody tr[data-producer='queue://{queue}'] td").nth(1)).to_have_text("1")


def test_stomp_clients_over_tcp_and_websocket_are_listed_and_an_admin_closes_one(
        admin_page, console_server, stomp_tcp, broker):
    tag = uuid.uuid4().hex[:6]
    queue, audit = f"cq.conn{tag}", f"cq.audit{tag}"
    tcp_client = RawTcp(stomp_tcp.port, login="admin", passcode=PASSWORD, timeout=10)
    ws_client = RawStomp(f"ws://127.0.0.1:{console_server.port}/stomp")
    ws_client.connect(login="admin", passcode=PASSWORD, **{"client-id": f"ws-app-{tag}"})
    ws_client.parser.version = "1.2"
    consume_and_produce(tcp_client, queue, audit, f"tcp-app-{tag}")
    ws_queue = f"{queue}.ws"
    ws_client.send("SUBSCRIBE", {"id": "orders-sub", "destination": f"/queue/{ws_queue}",
                                 "ack": "client-individual", "selector": "kind = 'order'",
                                 "activemq.prefetchSize": "5", "receipt": "r"})
    ws_client.expect("RECEIPT")
    for n in range(2):
        ws_client.send("SEND", {"destination": f"/queue/{audit}", "receipt": f"a{n}"}, b"audit")
        ws_client.expect("RECEIPT")
    ws_client.send("SEND", {"destination": f"/queue/{ws_queue}", "kind": "order", "receipt": "q"}, b"held")
    ws_client.expect("RECEIPT")
    assert ws_client.expect("MESSAGE").body == b"held"

    page = admin_page
    page.goto(f"{console_server.url}/console/")
    page.get_by_role("link", name="Connections").click()
    expect(page.get_by_role("heading", name="Connections")).to_be_visible()
    # both clients send to the audit queue: the destination filter finds the two of them
    page.fill("#f-destination", f"queue://{audit}")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#connections tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#connections tbody")).to_contain_text("stomp+tcp")
    expect(page.locator("#connections tbody")).to_contain_text("stomp+ws")
    tcp_row = page.locator("#connections tbody tr", has_text=f"tcp-app-{tag}")
    expect(tcp_row).to_contain_text("stomp+tcp")
    expect(tcp_row).to_contain_text("tcp://127.0.0.1:")
    ws_row = page.locator("#connections tbody tr", has_text=f"ws-app-{tag}")
    expect(ws_row).to_contain_text("stomp+ws")
    # the protocol filter narrows it to one
    page.select_option("#f-protocol", "stomp+ws")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"ws-app-{tag}")
    rows.first.locator("a").click()
    check_detail(page, "stomp+ws", f"ws-app-{tag}", ws_queue, audit)

    # the queue page links to the connections using the queue (its producers and consumers)...
    page.goto(f"{console_server.url}/console/queues/{audit}/")
    page.locator("#connections-link").click()
    expect(page.locator("#f-destination")).to_have_value(f"queue://{audit}")
    expect(rows).to_have_count(2)
    # ...and its consumers table to each consumer's connection
    page.goto(f"{console_server.url}/console/queues/{queue}/")
    page.locator("#consumers tbody tr td a", has_text=f"tcp-app-{tag}").click()
    expect(page).to_have_url(f"{console_server.url}/console/connections/"
                             f"{tcp_row_id(broker, queue)}/")
    check_detail(page, "stomp+tcp", f"tcp-app-{tag}", queue, audit)

    page.get_by_role("button", name="Close connection").click()
    confirm(page)
    error = tcp_client.expect("ERROR")
    assert error.get("message") == "Connection closed by an administrator"
    assert b"closed by admin" in error.body
    assert tcp_client.closed_within(5)
    expect(page.locator("#conn-state")).to_have_text("Connection closed.", timeout=15_000)
    # its unacknowledged message is back in the queue; the other client is untouched
    stats = broker.stats(f"queue://{queue}")
    assert stats.consumers == [] and stats.pending == 1 and stats.in_flight == 0
    assert broker.stats(f"queue://{ws_queue}").in_flight == 1
    page.goto(f"{console_server.url}/console/connections/")
    page.fill("#f-destination", f"queue://{audit}")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"ws-app-{tag}")
    tcp_client.close()
    ws_client.close()


def tcp_row_id(broker, queue: str) -> str:
    (consumer,) = broker.stats(f"queue://{queue}").consumers
    return consumer.connection_id


def test_a_reader_sees_no_close_button(reader_page, console_server, stomp_tcp):
    tag = uuid.uuid4().hex[:6]
    client = RawTcp(stomp_tcp.port, login="admin", passcode=PASSWORD, timeout=10)
    consume_and_produce(client, f"cq.r{tag}", f"cq.ra{tag}", f"reader-visible-{tag}")
    page = reader_page
    page.goto(f"{console_server.url}/console/connections/")
    page.fill("#f-client", f"reader-visible-{tag}")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#connections tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("stomp+tcp")
    rows.first.locator("a").click()
    expect(page.locator("#fields [data-field=protocol]")).to_have_text("stomp+tcp")
    expect(page.get_by_role("button", name="Close connection")).to_have_count(0)
    client.close()
