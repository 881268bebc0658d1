"""The console's header when Redis goes away and comes back, in Debian's headless Chromium: "Broker
unavailable" within two seconds of Redis hanging (SIGSTOP: connections stay open, nothing answers) and of
its death (SIGKILL: connections refused), "Live" again when Redis answers, without reloading the page or
restarting the gateway (issue 26, item 5). The gateway runs on a Redis of this test's own."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
from playwright.sync_api import expect

from signalbox.embedded_redis import EmbeddedRedis, free_port
from tests.console.conftest import USERS, login
from tests.helpers.gateway_server import ROOT, server_env, start_gateway

pytestmark = pytest.mark.e2e


def test_the_header_says_broker_unavailable_while_redis_is_away(chromium, tmp_path):
    store = EmbeddedRedis(tmp_path / "redis", port=free_port())
    store.start()
    data_dir = tmp_path / "console"
    data_dir.mkdir()
    namespace = f"t{uuid.uuid4().hex[:12]}"
    env = server_env(data_dir, namespace, REDIS_URL=store.url)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, timeout=120)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", USERS], cwd=ROOT, env=env, check=True,
                   timeout=60)
    server = start_gateway(data_dir, namespace, name="console-outage", REDIS_URL=store.url)
    server.url = f"http://127.0.0.1:{server.port}"
    page = None
    try:
        page = login(chromium, server, "admin")
        live = page.locator("#live")
        expect(live).to_have_attribute("data-state", "connected")
        expect(page.locator("[data-total=destinations]")).not_to_have_text("–")  # figures arrived
        store.process.send_signal(signal.SIGSTOP)
        try:
            stopped_at = time.monotonic()
            expect(live).to_have_attribute("data-state", "unavailable", timeout=2000)
            assert time.monotonic() - stopped_at < 2
            expect(live).to_contain_text("Broker unavailable")
            # and under the header, what it means for the figures on the page
            banner = page.locator("#feed-banner")
            expect(banner).to_be_visible()
            expect(banner).to_contain_text("The figures below are not updating (last update")
            # the time of the last figures, in UTC as every console time, which the status messages that
            # keep coming (each saying "unavailable") do not move
            said = banner.text_content()
            assert re.search(r"\(last update \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\)\.$", said), said
            page.wait_for_timeout(2500)
            assert banner.text_content() == said
        finally:
            store.process.send_signal(signal.SIGCONT)
        expect(live).to_have_attribute("data-state", "connected", timeout=5000)
        expect(page.locator("#feed-banner")).to_be_hidden()
        store.process.kill()
        killed_at = time.monotonic()
        expect(live).to_have_attribute("data-state", "unavailable", timeout=2000)
        assert time.monotonic() - killed_at < 2
        # the node page's endpoint answers, saying Redis is unreachable, and its page shows it
        node = page.evaluate('SB.api("GET", "console/node")')
        assert node["redis"]["status"] == "error" and node["processes"] is None, node
        assert node["maintenance"]["status"] == "error"
        page.goto(f"{server.url}/console/node/")
        expect(page.locator('[data-fact="server"]')).to_contain_text("unreachable")
        expect(page.locator("#processes tbody")).to_contain_text("holds the heartbeats, does not answer")
        expect(live).to_have_attribute("data-state", "unavailable", timeout=2000)
        expect(live).to_contain_text("Broker unavailable")
        store.start()  # same port, data folder and AOF
        expect(live).to_have_attribute("data-state", "connected", timeout=5000)
        expect(live).to_contain_text("Live")
        # the node page recovers by itself too: Redis's facts, and the gateway's heartbeat again
        expect(page.locator('[data-fact="server"]')).not_to_contain_text("unreachable")
        expect(page.locator('#processes tbody tr[data-role="web"][data-state="running"]')).to_have_count(1)
        page.goto(f"{server.url}/console/")
        expect(page.locator("[data-total=destinations]")).not_to_have_text("–")
    finally:
        if page is not None:
            page.context.close()
        server.stop()
        store.stop()


def test_a_stalled_server_reads_stale_within_two_seconds(chromium, console_server):
    """The gateway stopped (SIGSTOP: its sockets stay open, nothing arrives): "Stale — no updates" and the
    banner within two seconds of the last message, "Live" again when it goes on."""
    server = start_gateway(console_server.data_dir, console_server.namespace, name="console-stall")
    server.url = f"http://127.0.0.1:{server.port}"
    page = None
    try:
        page = login(chromium, server, "admin")
        live = page.locator("#live")
        expect(live).to_have_attribute("data-state", "connected")
        # in the page: when the feed's last message came, and when the indicator turned stale. The message's
        # own time (event.timeStamp: when it arrived, on performance.now()'s clock), not the time this
        # listener runs: it runs after the page's, which on a loaded machine may take a while over it.
        page.evaluate("""() => {
            window.lastFeedMessage = performance.now();
            SB.feeds[0].socket.addEventListener("message", (e) => { window.lastFeedMessage = e.timeStamp; });
            const live = document.getElementById("live");
            new MutationObserver(() => {
                if (live.dataset.state === "stale" && !window.staleAt) window.staleAt = performance.now();
            }).observe(live, { attributes: true });
        }""")
        server.process.send_signal(signal.SIGSTOP)
        try:
            expect(live).to_have_attribute("data-state", "stale", timeout=3000)
            silent_ms = page.evaluate("window.staleAt - window.lastFeedMessage")
            # 1.75 s of silence, checked every 0.25 s, on the monotonic clock this test reads too (the page
            # timed it with Date.now(), the wall clock, and two full runs read 1684.6 and 1464.2 ms)
            assert 1700 <= silent_ms <= 2100, silent_ms
            expect(page.locator("#feed-banner")).to_contain_text("no updates from the server")
        finally:
            server.process.send_signal(signal.SIGCONT)
        expect(live).to_have_attribute("data-state", "connected", timeout=5000)
        expect(page.locator("#feed-banner")).to_be_hidden()
    finally:
        if page is not None:
            page.context.close()
        server.stop()


def test_the_banner_names_the_time_of_figures_the_page_fetched(chromium, console_server):
    """A page's first figures come from an API answer (GET console/overview), the feed's from its messages:
    a feed that stalls before it sent any figures still gets a banner naming the last update, the API
    answer's (it said only "not updating" when the first feed figures had not come yet, which a full
    test run on a loaded machine met)."""
    page = login(chromium, console_server, "admin")
    try:
        passing = {"status": True}

        def feed(ws) -> None:  # the page's feed: only the server's status messages, until they stop too
            server = ws.connect_to_server()
            server.on_message(lambda text: ws.send(text) if passing["status"] and isinstance(text, str)
                              and json.loads(text).get("type") == "status" else None)

        page.route_web_socket(re.compile(r"/ws/console/events"), feed)
        page.reload()
        live = page.locator("#live")
        expect(live).to_have_attribute("data-state", "connected")
        expect(page.locator("[data-total=destinations]")).not_to_have_text("–")  # the API's answer
        passing["status"] = False
        expect(live).to_have_attribute("data-state", "stale", timeout=3000)
        banner = page.locator("#feed-banner")
        expect(banner).to_contain_text("no updates from the server")
        expect(banner).to_have_text(re.compile(r"\(last update \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\)\.$"))
    finally:
        page.context.close()


def test_a_dropped_redis_connection_does_not_replay_the_queue_page_s_events(admin_page, console_server,
                                                                          broker, queue_name):
    """The feed's stream reader losing its Redis connection (a network blip, a failover, CLIENT KILL) goes
    on from the last event it sent: "Recent events" does not list every event since the page opened again,
    as if it had just happened."""
    from broker_core.messages import Message

    page = admin_page
    broker.send(queue_name, [Message(body="before")])
    page.goto(f"{console_server.url}/console/queues/{queue_name}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "connected")
    expect(page.locator("[data-stat=queue_size]")).to_have_text("1")
    broker.send(queue_name, [Message(body=str(i)) for i in range(3)])
    events = page.locator("#events li")
    expect(events).to_have_count(3)

    def readers() -> set[int]:
        return {int(c["id"]) for c in broker.redis.client_list() if c["cmd"].startswith("xread")}

    dropped = readers()
    assert dropped
    for client in dropped:
        broker.redis.client_kill_filter(_id=client)
    deadline = time.monotonic() + 10
    while not readers() - dropped:  # the feed reads the stream again, on a new connection
        assert time.monotonic() < deadline, "the feed did not read its stream again"
        time.sleep(0.1)
    broker.send(queue_name, [Message(body="after")])
    expect(events).to_have_count(4)
    page.wait_for_timeout(1500)  # (a replay would arrive in the feed's next batches)
    texts = events.all_inner_texts()
    assert len(texts) == 4 and len(set(texts)) == 4, texts
