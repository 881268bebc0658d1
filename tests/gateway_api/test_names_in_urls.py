"""Destination names that hold characters with a meaning in a URL path (`/`, `%`, `#`, non-ASCII) reach
every endpoint that names them in its path, over real HTTP (uvicorn, which decodes %2F before routing).

A client puts a name in a path segment percent-encoded whole (`quote(name, safe="")`); the gateway routes
on the raw path, so `orders%2Feu` is the queue `orders/eu`, never the queue `orders` and a sub-resource
`eu`. Names the broker refuses (`?`, whitespace) are refused by name, changing nothing (docs/api.md,
"Names in URLs")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.helpers.gateway_server import ALICE_TOKEN, own_gateway

# What the broker accepts (broker_core/destinations.py): everything but `{`, `}`, `,`, `?`, whitespace and
# control characters, in dot-separated segments. These are the ones a URL path treats specially.
SPECIAL = {
    "slash": "orders/eu",
    "leading-slash": "/orders",
    "percent": "100%",
    "percent-2F": "a%2Fb",  # a `%` followed by what reads as an escape: decoded once, not twice
    "hash": "a#b",
    "non-ascii": "café/ü",
    "sub-resource": "x/purge",  # not the queue `x` and its /purge
    "dot-segment": "a/./b",
}


def segment(name: str) -> str:
    return quote(name, safe="")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with own_gateway(tmp_path_factory.mktemp("names-gateway"), "names") as gateway:
        yield gateway


@pytest.fixture
def http(gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{gateway.port}", timeout=30,
                      headers={"Authorization": f"Token {ALICE_TOKEN}"}) as client:
        yield client


def unique(special: str) -> str:
    return f"n{uuid.uuid4().hex[:8]}.{special}"


def stat(http: httpx.Client, kind: str, name: str) -> dict:
    answer = http.get(f"/api/v1/{kind}/{segment(name)}")
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("special", SPECIAL.values(), ids=SPECIAL.keys())
def test_every_queue_endpoint_reaches_the_queue_its_encoded_name_names(http, special):
    name = unique(special)
    base = f"/api/v1/queues/{segment(name)}"
    neighbour = name.split("/")[0] if special in ("orders/eu", "x/purge") else None  # `n….x` by `n….x/purge`
    if neighbour:
        assert http.post(f"/api/v1/queues/{segment(neighbour)}/messages",
                         json={"body": "bystander"}).status_code == 201

    created = http.put(base)
    assert created.status_code == 201, created.text
    assert created.json()["destination"] == f"queue://{name}"
    for body in ("one", "two"):  # the first through Django, the second on the lean path (token cached)
        sent = http.post(f"{base}/messages", json={"body": body, "group_id": "g"})
        assert sent.status_code == 201, sent.text
    assert stat(http, "queues", name)["queue_size"] == 2

    browsed = http.get(f"{base}/messages")
    assert browsed.status_code == 200, browsed.text
    assert [m["body"] for m in browsed.json()["messages"]] == ["one", "two"]

    consumer = http.post(f"{base}/consumers", json={"ack_mode": "client-individual"})
    assert consumer.status_code == 201, consumer.text
    links = consumer.json()["links"]
    assert links["self"] == f"{http.base_url}{base}/consumers/{consumer.json()['consumer_id']}"
    received = http.post(links["receive"], params={"max_messages": 1})
    assert received.status_code == 200, received.text
    [message] = received.json()["messages"]
    assert message["body"] == "one" and message["destination"] == f"queue://{name}"
    acked = http.post(links["ack"], json={"message_ids": [message["message_id"]]})
    assert acked.status_code == 200, acked.text
    assert http.delete(links["self"]).status_code == 204

    for groups in (f"{base}/groups", f"/api/v1/console/queues/{segment(name)}/groups"):
        answer = http.get(groups)
        assert answer.status_code == 200, (groups, answer.text)
    assert http.get(f"/api/v1/console/queues/{segment(name)}/rates").status_code == 200

    purged = http.post(f"{base}/purge")
    assert purged.status_code == 200, purged.text
    assert stat(http, "queues", name)["queue_size"] == 0
    deleted = http.delete(base)
    assert deleted.status_code == 200, deleted.text
    assert http.get(base).status_code == 404
    if neighbour:  # untouched by everything done to its namesake
        assert stat(http, "queues", neighbour)["queue_size"] == 1


@pytest.mark.parametrize("special", SPECIAL.values(), ids=SPECIAL.keys())
def test_a_topic_named_with_url_characters_is_reachable(http, special):
    name = unique(special)
    base = f"/api/v1/topics/{segment(name)}"
    consumer = http.post(f"{base}/consumers", json={"client_id": "c1", "subscription_name": "s/1"})
    assert consumer.status_code == 201, consumer.text
    assert http.post(f"{base}/messages", json={"body": "tick"}).status_code == 201
    topic = stat(http, "topics", name)
    assert topic["destination"] == f"topic://{name}"
    subscriptions = http.get(f"{base}/subscriptions")
    assert subscriptions.status_code == 200, subscriptions.text
    received = http.post(consumer.json()["links"]["receive"], params={"max_messages": 1})
    assert [m["body"] for m in received.json()["messages"]] == ["tick"], received.text
    assert http.delete(consumer.json()["links"]["self"]).status_code == 204
    # the durable subscription, by client id and subscription name (`s/1` holds a slash too)
    dropped = http.delete(f"{base}/subscriptions/c1/{segment('s/1')}")
    assert dropped.status_code == 200 and dropped.json()["removed"] == 1, dropped.text


@pytest.mark.parametrize("special", ["orders/eu", "100%", "café"])
def test_activemq_servlet_reaches_such_a_queue_by_its_destination_parameter(http, special):
    """ActiveMQ's /api/message takes the name from `destination` as it is; from the path, a `/` (encoded
    or not, as Jetty decodes %2F) is its separator and becomes `.`."""
    name = unique(special)
    sent = http.post("/api/message", params={"destination": f"queue://{name}", "body": "hello"})
    assert sent.status_code == 200, sent.text
    assert stat(http, "queues", name)["queue_size"] == 1
    received = http.get("/api/message", params={"destination": name, "type": "queue", "readTimeout": 1000})
    assert received.status_code == 200 and received.text == "hello", received.text

    dotted = unique("a/b")
    sent = http.post(f"/api/message/{segment(dotted)}", params={"type": "queue", "body": "x"})
    assert sent.status_code == 200, sent.text
    assert stat(http, "queues", dotted.replace("/", "."))["queue_size"] == 1


@pytest.mark.parametrize(("special", "named"), [("a?b", "'?'"), ("a b", "U+0020"),
                                               ("a,b", "',' separates the parts of a composite destination")])
def test_names_the_broker_refuses_are_refused_by_name_and_change_nothing(http, special, named):
    name = unique(special)
    prefix = name.split(".")[0]
    for method, path in (("PUT", ""), ("POST", "/messages"), ("POST", "/purge"), ("GET", "")):
        answer = http.request(method, f"/api/v1/queues/{segment(name)}{path}",
                              json={"body": "x"} if path == "/messages" else None)
        assert answer.status_code == 400, (method, path, answer.text)
        problem = answer.json()
        assert problem["code"] == "invalid_destination" and named in problem["detail"], problem
        assert "parse_composite" not in problem["detail"], problem  # (a function's name: not the user's)
    listed = http.get("/api/v1/destinations", params={"search": prefix}).json()
    assert [d for d in listed["results"] if d["name"].startswith(prefix)] == []


def test_a_lowercase_escape_names_the_same_queue_and_problems_give_the_path_as_encoded(http):
    name = unique("orders/eu")
    assert http.put(f"/api/v1/queues/{segment(name)}").status_code == 201
    lower = http.get(f"/api/v1/queues/{segment(name).replace('%2F', '%2f')}")
    assert lower.status_code == 200 and lower.json()["name"] == name, lower.text
    missing = http.get(f"/api/v1/queues/{segment(name)}/messages/ID:none", params={"x": "1"})
    assert missing.status_code == 404, missing.text
    assert missing.json()["instance"] == f"/api/v1/queues/{segment(name)}/messages/ID:none?x=1"
