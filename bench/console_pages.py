"""Server time of the console's pages and of the API calls they make, with 10,000 destinations and a
1,000,000-message queue (issue 9: target under 300 ms each).

    .venv/bin/python bench/console_pages.py [--destinations 10000] [--messages 1000000] [--runs 20]
        [--only destinations]

Starts a throw-away system (console/demo.py: embedded Redis, SQLite, uvicorn), creates the
destinations and fills one queue with the batched send (1,000 messages per call; this takes a few
minutes), then logs in and times each request from a client on the same machine (localhost: the
time is the server's plus a loopback round trip). Prints median and 95th percentile per request.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_core.messages import Message  # noqa: E402
from broker_core.model import ConsumerSpec  # noqa: E402
from console.demo import DemoSystem  # noqa: E402

BIG = "bench.big"


def fill(system: DemoSystem, destinations: int, messages: int) -> None:
    broker = system.broker
    started = time.monotonic()
    for i in range(destinations - 1):
        broker.ensure_destination(f"bench.d{i:05d}")
    print(f"created {destinations - 1} destinations in {time.monotonic() - started:.1f} s", flush=True)
    started = time.monotonic()
    body = "x" * 100
    for start in range(0, messages, 1000):
        broker.send(BIG, [Message(body=body, group_id=f"g{(start + i) % 500}", properties={"n": start + i})
                          for i in range(min(1000, messages - start))])
        if start and start % 100_000 == 0:
            print(f"  {start:,} messages sent ({time.monotonic() - started:.0f} s)", flush=True)
    print(f"sent {messages:,} messages in {time.monotonic() - started:.1f} s", flush=True)
    for n in range(2):  # two consumers with their prefetch windows full, owning groups
        consumer = broker.add_consumer(BIG, ConsumerSpec(prefetch=500, lease_ms=3_600_000, client_id=f"c{n}"))
        broker.receive(consumer, 500)


def login(system: DemoSystem) -> requests.Session:
    session = requests.Session()
    page = session.get(f"{system.url}/console/login/")
    page.raise_for_status()
    reply = session.post(f"{system.url}/console/login/", allow_redirects=False, headers={"Referer": page.url},
                         data={"username": system.user, "password": system.password,
                               "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    assert reply.status_code == 302, reply.text[:500]
    return session


def timed(session: requests.Session, url: str, runs: int) -> tuple[float, float, int]:
    session.get(url).raise_for_status()  # warm: script load, first snapshot
    samples = []
    size = 0
    for _ in range(runs):
        started = time.perf_counter()
        reply = session.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        reply.raise_for_status()
        size = len(reply.content)
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.95) - 1)], size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--destinations", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--only", default="", help="time only the requests whose label contains this")
    args = parser.parse_args()
    with DemoSystem() as system:
        fill(system, args.destinations, args.messages)
        session = login(system)
        deep = session.get(f"{system.url}/api/v1/queues/{BIG}/messages", params={"limit": 1000}).json()
        for _ in range(49):  # page 50 of the browse: 50,000 messages in
            deep = session.get(f"{system.url}/api/v1/queues/{BIG}/messages",
                               params={"limit": 1000, "cursor": deep["next_cursor"]}).json()
        cursor = deep["next_cursor"]
        u = system.url
        api = f"{u}/api/v1"
        big = f"{api}/queues/{BIG}"
        requests_ = [
            ("page  /console/ (overview)", f"{u}/console/"),
            ("page  /console/destinations/", f"{u}/console/destinations/"),
            ("page  /console/queues/<big>/", f"{u}/console/queues/{BIG}/"),
            ("page  /console/queues/<big>/browse/", f"{u}/console/queues/{BIG}/browse/"),
            ("page  /console/dead-letters/", f"{u}/console/dead-letters/"),
            ("page  /console/send/", f"{u}/console/send/"),
            ("api   console/overview (totals)", f"{api}/console/overview"),
            ("api   destinations, by name, page 1", f"{api}/destinations?ordering=name&limit=50"),
            ("api   destinations, by name, page 150",
             f"{api}/destinations?ordering=name&limit=50&offset=7450"),
            ("api   destinations, by -queue_size", f"{api}/destinations?ordering=-queue_size&limit=50"),
            ("api   destinations, by -enqueue_rate", f"{api}/destinations?ordering=-enqueue_rate&limit=50"),
            ("api   destinations, search 'd0999'", f"{api}/destinations?search=d0999&limit=50"),
            # the list's filters (issue 26): on the statistics index held in the process
            ("api   destinations, non_empty=true", f"{api}/destinations?non_empty=true&limit=50"),
            ("api   destinations, no consumers, page 150",
             f"{api}/destinations?has_consumers=false&limit=50&offset=7450"),
            ("api   destinations, waiting, no consumer, -messages",
             f"{api}/destinations?non_empty=true&has_consumers=false&dlq=false&ordering=-messages&limit=50"),
            ("api   destinations, dlq=true", f"{api}/destinations?dlq=true&limit=50"),
            ("api   queues/<big> (stats, consumers)", big),
            ("api   console/queues/<big>/groups", f"{api}/console/queues/{BIG}/groups"),
            ("api   browse <big>, first 50", f"{big}/messages?limit=50"),
            ("api   browse <big>, 50 at 50,000 in", f"{big}/messages?limit=50&cursor={cursor}"),
            ("api   browse <big>, selector n > 999990", f"{big}/messages?limit=50&selector=n%20%3E%20999990"),
            ("api   queues/<big>/scheduled", f"{big}/scheduled?limit=50"),
            ("api   console/dead-letters", f"{api}/console/dead-letters"),
        ]
        print(f"\n{'request':44} {'median ms':>10} {'p95 ms':>8} {'bytes':>9}")
        for label, url in requests_:
            if args.only not in label:
                continue
            median, p95, size = timed(session, url, args.runs)
            print(f"{label:44} {median:10.1f} {p95:8.1f} {size:9d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
