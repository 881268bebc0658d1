"""Regenerates the console screenshots in docs/console/: `.venv/bin/python -m console.screenshots`.

Starts a throw-away system (console/demo.py) with a Celery worker and beat, fills a demo queue with two
consumers, message groups and steady traffic, and photographs the overview, a queue page and its groups
view, the node page and the destination list (1366x768 with a row's menu open, and at phone width) in
light and dark with Debian's headless Chromium (Playwright).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from console.demo import ROOT, DemoSystem

OUT = ROOT / "docs" / "console"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def populate(system: DemoSystem) -> None:
    broker = system.broker
    for name in ("billing.invoices", "inventory.updates", "payments.eu", "payments.us", "shipping.labels"):
        broker.send(name, [Message(body=f"{name} {i}") for i in range(17 * len(name) % 40)])
    fast = broker.add_consumer("orders.eu", ConsumerSpec(prefetch=20, lease_ms=3_600_000,
                                                         client_id="picker-1", ack_mode="client-individual"))
    broker.add_consumer("orders.eu", ConsumerSpec(prefetch=10, lease_ms=3_600_000, client_id="picker-2",
                                                  selector="JMSPriority >= 4", ack_mode="client-individual"))
    broker.send("orders.eu", [Message(body=f'{{"cart": {c}, "line": {i}}}', group_id=f"cart-{c}",
                                      priority=4 + c % 3, properties={"region": "eu"})
                              for c in range(1, 8) for i in range(6)])
    delivered = broker.receive(fast, 8)
    broker.ack(fast, [d.message_id for d in delivered[:5]])
    poison = broker.add_consumer("payments.eu", ConsumerSpec(prefetch=1, lease_ms=60_000,
                                                             ack_mode="client-individual"))
    for d in broker.receive(poison, 1):
        broker.nack(poison, d.message_id, poison=True)
    broker.close_consumer(poison)


def traffic(system: DemoSystem, stop: threading.Event) -> None:
    """Steady sends and acks so the rate charts have something to show."""
    from broker_core import rates
    from broker_core.broker import Broker

    broker = Broker(system.redis, system.namespace)
    consumer = broker.add_consumer("inventory.updates", ConsumerSpec(prefetch=50, lease_ms=120_000,
                                                                      client_id="indexer",
                                                                      ack_mode="client-individual"))
    n = 0
    while not stop.is_set():
        n += 1
        broker.send("inventory.updates", [Message(body=f"update {n}.{i}") for i in range(5 + n % 7)])
        broker.send("orders.eu", [Message(body=f'{{"order": {n}}}', properties={"region": "eu"})
                                  for _ in range(n % 3)])
        got = broker.receive(consumer, 50)
        broker.ack(consumer, [d.message_id for d in got[: max(1, len(got) - 2)]])
        rates.sample_due(broker)  # the demo runs no maintenance worker: sample the rate history here
        time.sleep(0.25)


def shoot(system: DemoSystem) -> list[Path]:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        for scheme in ("light", "dark"):
            context = browser.new_context(color_scheme=scheme, viewport={"width": 1366, "height": 900})
            page = context.new_page()
            page.goto(f"{system.url}/console/login/")
            page.fill("#id_username", system.user)
            page.fill("#id_password", system.password)
            page.click("button[type=submit]")
            page.wait_for_url(f"{system.url}/console/")
            # the worker answers the health check's ping (Celery starts in seconds, more on a busy machine)
            page.wait_for_selector("#health tbody tr:has-text('workers:')", timeout=60_000)
            page.wait_for_timeout(12_000)  # a few live totals, so the rate chart has a line
            written.append(OUT / f"overview-{scheme}.png")
            page.screenshot(path=written[-1], full_page=True)
            page.goto(f"{system.url}/console/node/")
            page.wait_for_selector('#processes tbody tr[data-role="worker"][data-state="running"]')
            page.wait_for_timeout(2_500)
            written.append(OUT / f"node-{scheme}.png")
            page.screenshot(path=written[-1], full_page=True)
            page.goto(f"{system.url}/console/queues/orders.eu/")
            page.wait_for_selector("#groups tbody tr[data-group]")
            page.wait_for_timeout(4_000)
            written.append(OUT / f"queue-{scheme}.png")
            page.screenshot(path=written[-1], full_page=True)
            written.append(OUT / f"groups-{scheme}.png")
            page.locator("#groups-section").screenshot(path=written[-1])
            # the destination list at a laptop's 1366x768 with a row's Actions menu open, then on a phone
            page.set_viewport_size({"width": 1366, "height": 768})
            page.goto(f"{system.url}/console/destinations/")
            page.wait_for_selector('#destinations tr[data-uri="queue://orders.eu"]')
            page.locator('#destinations tr[data-uri="queue://orders.eu"] summary').click()
            written.append(OUT / f"destinations-{scheme}.png")
            page.screenshot(path=written[-1])
            page.set_viewport_size({"width": 390, "height": 844})
            page.goto(f"{system.url}/console/destinations/?non_empty=true&ordering=-messages")
            page.wait_for_selector('#destinations tr[data-uri="queue://orders.eu"]')
            written.append(OUT / f"destinations-phone-{scheme}.png")
            page.screenshot(path=written[-1])
            context.close()
        browser.close()
    return written


def main() -> int:
    if not Path(CHROMIUM).exists():
        print("console.screenshots: Debian's chromium is not installed (apt-get install chromium)",
              file=sys.stderr)
        return 2
    with DemoSystem(celery=True) as system:
        populate(system)
        stop = threading.Event()
        thread = threading.Thread(target=traffic, args=(system, stop), daemon=True)
        thread.start()
        try:
            written = shoot(system)
        finally:
            stop.set()
            thread.join(5)
    for path in written:
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
