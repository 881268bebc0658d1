"""The connection registry against real servers: a gateway process (uvicorn: STOMP over WebSocket, the JSON
protocol, REST) and a STOMP-over-TCP listener on one Redis namespace. Each protocol's connection appears in
GET /api/v1/connections with its subscription and producer rows, Close ends it the way its protocol does
and its unacknowledged messages go back, a killed process's connections leave the list within a lease, and
a user without rights sees only what is theirs or on destinations they may read."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest

from gateway.stomp.frames import Frame
from tests.helpers.gateway_server import (
    spawn_gateway,
    spawn_stomp_listener,
    wait_listening,
)
from tests.helpers.own_servers import own_servers_fixtures
from tests.helpers.polling import eventually
from tests.helpers.stomp_client import RawStomp, RawTcp

pytestmark = pytest.mark.e2e

LEASE_MS = 1500  # the registry's lease in these servers: a killed process's connections go within it
FAST = {"SIGNALBOX_CONNECTION_LEASE_MS": str(LEASE_MS), "SIGNALBOX_CONNECTION_POLL_SECONDS": "0.2",
        "SIGNALBOX_WS_LEASE_MS": "3000"}

servers, api, broker = own_servers_fixtures("conns", **FAST)


def find(api: httpx.Client, **filters: str) -> list[dict[str, Any]]:
    response = api.get("/connections", params={"limit": 200, **filters})
    assert response.status_code == 200, response.text
    return response.json()["connections"]


def detail(api: httpx.Client, connection_id: str) -> dict[str, Any] | None:
    response = api.get(f"/connections/{connection_id}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    return response.json()


def stomp_session(client: Any, queue: str, audit: str, client_id: str) -> Frame:
    """CONNECT with a client id, SUBSCRIBE in client ack mode with a selector and prefetch, SEND twice
    to another queue, then receive one message of `queue` and leave it unacknowledged."""
    client.connect(**{"client-id": client_id})
    client.send("SUBSCRIBE", {"id": "sub-1", "destination": f"/queue/{queue}", "ack": "client-individual",
                              "selector": "n > 0", "activemq.prefetchSize": "5", "receipt": "r1"})
    client.expect("RECEIPT")
    for n in (1, 2):
        client.send("SEND", {"destination": f"/queue/{audit}", "receipt": f"s{n}"}, b"audit")
        client.expect("RECEIPT")
    client.send("SEND", {"destination": f"/queue/{queue}", "n": "1", "receipt": "s3"}, b"held")
    client.expect("RECEIPT")
    message = client.expect("MESSAGE")
    assert message.body == b"held"
    return message


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_stomp_connection_listed_with_rows_and_closed_by_an_admin(servers, api, broker, transport):
    queue, audit, client_id = (f"q{uuid.uuid4().hex[:8]}", f"a{uuid.uuid4().hex[:8]}",
                               f"app-{uuid.uuid4().hex[:6]}")
    if transport == "tcp":
        client: Any = RawTcp(servers["listener"].port)
    else:
        client = RawStomp(servers["gateway"].stomp_url)
    protocol = "stomp+tcp" if transport == "tcp" else "stomp+ws"
    stomp_session(client, queue, audit, client_id)
    rows = eventually(lambda: find(api, client=client_id))
    assert len(rows) == 1
    row = rows[0]
    assert (row["protocol"], row["client_id"], row["user"]) == (protocol, client_id, "alice")
    assert row["address"].startswith("tcp://127.0.0.1:" if transport == "tcp" else "ws://127.0.0.1:")
    assert row["connected_since"] > 0
    # filters: protocol, user, destination (a queue it sent to, a queue it subscribes to)
    assert row["id"] in {r["id"] for r in find(api, protocol=protocol, user="alice")}
    assert [r["id"] for r in find(api, destination=f"queue://{audit}")] == [row["id"]]
    assert [r["id"] for r in find(api, destination=f"queue://{queue}")] == [row["id"]]
    assert find(api, protocol="json-ws", client=client_id) == []

    def rows_written() -> dict[str, Any] | None:
        d = detail(api, row["id"])
        ready = d and d["producers"] and sum(p["count"] for p in d["producers"]) == 3
        return d if ready else None

    d = eventually(rows_written)
    (sub,) = d["subscriptions"]
    assert sub["key"] == "sub-1" and sub["destinations"] == [f"queue://{queue}"]
    assert (sub["ack_mode"], sub["selector"], sub["prefetch"]) == ("client-individual", "n > 0", 5)
    assert len(sub["consumers"]) == 1
    producers = {p["destination"]: p for p in d["producers"]}
    assert producers[f"queue://{audit}"]["count"] == 2 and producers[f"queue://{queue}"]["count"] == 1
    assert producers[f"queue://{audit}"]["last_send"] > 0
    # the queue's consumer names this connection (the console's link from the consumers table)
    (consumer,) = broker.stats(f"queue://{queue}").consumers
    assert consumer.connection_id == row["id"] and consumer.in_flight == 1

    response = api.post(f"/connections/{row['id']}/close")
    assert response.status_code == 202, response.text
    assert response.json()["protocol"] == protocol
    error = client.expect("ERROR", timeout=5)
    assert error.get("message") == "Connection closed by an administrator"
    assert b"closed by alice" in error.body
    assert client.closed_within(5)
    client.close()
    # its unacknowledged message went back to the queue, redelivered; the entry is gone
    stats = broker.stats(f"queue://{queue}")
    assert stats.consumers == [] and stats.pending == 1 and stats.in_flight == 0
    other = RawTcp(servers["listener"].port)
    other.connect()
    other.send("SUBSCRIBE", {"id": "s", "destination": f"/queue/{queue}", "ack": "auto"})
    again = other.expect("MESSAGE")
    assert again.body == b"held" and again.get("redelivered") == "true"
    other.close()
    eventually(lambda: detail(api, row["id"]) is None)


def test_json_websocket_connection_listed_and_closed(servers, api, broker):
    from websockets.sync.client import connect

    queue = f"q{uuid.uuid4().hex[:8]}"
    url = f"ws://127.0.0.1:{servers['gateway'].port}/ws/v1"
    with connect(url, open_timeout=5) as ws:
        def request(obj: dict[str, Any]) -> dict[str, Any]:
            ws.send(json.dumps(obj))
            while True:
                answer = json.loads(ws.recv(5))
                if answer.get("type") != "message":
                    return answer

        assert request({"type": "connect", "id": 1, "login": "alice", "passcode": "secret"})["type"] == "ok"
        assert request({"type": "subscribe", "id": 2, "subscription": "mine", "destination": f"queue://{queue}",
                        "ack_mode": "client-individual", "prefetch": 3})["type"] == "ok"
        assert request({"type": "send", "id": 3, "destination": f"queue://{queue}",
                        "messages": [{"body": "x"}, {"body": "y"}]})["type"] == "ok"
        rows = eventually(lambda: find(api, protocol="json-ws", destination=f"queue://{queue}"))
        cid = rows[0]["id"]
        d = eventually(lambda: (x := detail(api, cid)) and x["producers"] and x)
        assert d["subscriptions"][0]["key"] == "mine" and d["subscriptions"][0]["prefetch"] == 3
        assert d["producers"] == [{"destination": f"queue://{queue}", "count": 2,
                                   "last_send": d["producers"][0]["last_send"]}]
        eventually(lambda: broker.stats(f"queue://{queue}").in_flight == 2)
        assert api.post(f"/connections/{cid}/close").status_code == 202
        from websockets.exceptions import ConnectionClosed

        seen = []
        with pytest.raises(ConnectionClosed):
            while True:
                seen.append(json.loads(ws.recv(5)))
        assert seen[-1]["type"] == "error" and seen[-1]["code"] == "connection_closed"
    stats = broker.stats(f"queue://{queue}")
    assert stats.pending == 2 and stats.in_flight == 0
    eventually(lambda: detail(api, cid) is None)


def test_rest_consumer_listed_and_closed(servers, api, broker):
    queue = f"q{uuid.uuid4().hex[:8]}"
    created = api.post(f"/queues/{queue}/consumers", json={"ack_mode": "client-individual",
                                                           "client_id": "rest-app", "selector": "a = 1"})
    assert created.status_code == 201, created.text
    consumer_id = created.json()["consumer_id"]
    d = detail(api, consumer_id)
    assert d["protocol"] == "rest" and d["client_id"] == "rest-app" and d["user"] == "alice"
    assert d["subscriptions"][0]["consumers"] == [consumer_id]
    assert d["subscriptions"][0]["selector"] == "a = 1"
    sent = api.post(f"/queues/{queue}/messages", json={"body": "r", "properties": {"a": 1}})
    assert sent.status_code == 201, sent.text
    got = api.post(f"/queues/{queue}/consumers/{consumer_id}/receive")
    assert got.status_code == 200 and len(got.json()["messages"]) == 1
    closed = api.post(f"/connections/{consumer_id}/close")
    assert closed.status_code == 200 and closed.json()["status"] == "closed"
    assert detail(api, consumer_id) is None
    assert broker.stats(f"queue://{queue}").pending == 1  # the unacknowledged message went back
    assert api.post(f"/queues/{queue}/consumers/{consumer_id}/receive").status_code in (404, 410)
    # DELETE of a consumer drops its entry too
    second = api.post(f"/queues/{queue}/consumers", json={}).json()["consumer_id"]
    assert detail(api, second) is not None
    assert api.delete(f"/queues/{queue}/consumers/{second}").status_code == 204
    assert detail(api, second) is None


def test_killed_process_connections_leave_the_list_and_their_messages_return(servers, api, broker):
    queue = f"q{uuid.uuid4().hex[:8]}"
    doomed = wait_listening(spawn_stomp_listener(servers["data_dir"], servers["namespace"], "conns-doomed",
                                                 **FAST))
    client = RawTcp(doomed.port)
    stomp_session(client, queue, f"a{uuid.uuid4().hex[:8]}", "doomed-app")
    (row,) = eventually(lambda: find(api, client="doomed-app"))
    doomed.kill()
    client.close()
    killed_at = time.monotonic()
    eventually(lambda: detail(api, row["id"]) is None, timeout=LEASE_MS / 1000 + 3)
    assert time.monotonic() - killed_at < LEASE_MS / 1000 + 3
    assert find(api, client="doomed-app") == []
    # the consumer's own lease (3 s here) returns its message; the surviving listener's clients reap it
    other = RawTcp(servers["listener"].port)
    other.connect()
    other.send("SUBSCRIBE", {"id": "s", "destination": f"/queue/{queue}", "ack": "auto"})
    assert other.expect("MESSAGE", timeout=15).body == b"held"
    other.close()


def test_who_sees_and_who_closes(servers, api):
    """bob may read queue://bob.> only: he sees connections on it and his own, and may not close."""
    mine = RawTcp(servers["listener"].port)
    mine.connect(**{"client-id": f"hidden-{uuid.uuid4().hex[:6]}"})
    mine.send("SEND", {"destination": f"/queue/secret{uuid.uuid4().hex[:6]}", "receipt": "r"}, b"x")
    mine.expect("RECEIPT")
    shared = RawTcp(servers["listener"].port)
    shared.connect(**{"client-id": f"shared-{uuid.uuid4().hex[:6]}"})
    shared.send("SEND", {"destination": f"/queue/bob.{uuid.uuid4().hex[:6]}", "receipt": "r"}, b"x")
    shared.expect("RECEIPT")
    bobs = RawTcp(servers["listener"].port)
    bobs.send("CONNECT", {"accept-version": "1.2", "login": "bob", "passcode": "secret", "host": "x"})
    bobs.expect("CONNECTED")
    ids = {}
    for name in ("hidden-", "shared-"):
        ids[name] = eventually(lambda n=name: [r for r in find(api, client=n)
                                               if detail(api, r["id"])["producers"]])[-1]["id"]
    with httpx.Client(base_url=str(api.base_url)) as anonymous:
        assert anonymous.get("/connections").status_code in (401, 403)
    token = api.post("/auth/token", json={"username": "bob", "password": "secret"}, headers={
        "Authorization": ""}).json()["token"]
    with httpx.Client(base_url=str(api.base_url), headers={"Authorization": f"Token {token}"}) as bob:
        seen = {r["id"] for r in bob.get("/connections", params={"limit": 200}).json()["connections"]}
        assert ids["shared-"] in seen and ids["hidden-"] not in seen
        assert all(r["user"] == "bob" for r in bob.get("/connections", params={"user": "bob"}).json()[
            "connections"])
        assert bob.get("/connections", params={"user": "bob"}).json()["connections"]  # his own
        assert bob.get(f"/connections/{ids['hidden-']}").status_code == 404
        assert bob.get(f"/connections/{ids['shared-']}").status_code == 200
        refused = bob.post(f"/connections/{ids['shared-']}/close")
        assert refused.status_code == 403 and "staff" in refused.text
    for client in (mine, shared, bobs):
        client.close()


def test_listing_refuses_a_bad_limit_by_name(api):
    response = api.get("/connections", params={"limit": 100000})
    assert response.status_code == 400 and "limit must be 1..200" in response.text
    assert api.get("/connections/nope").status_code == 404
    assert api.post("/connections/nope/close").status_code == 404


def test_a_full_registry_refuses_a_new_connection_by_name(servers):
    """SIGNALBOX_CONNECTION_REGISTRY_LIMIT=1 on a namespace of its own: the second connection gets an ERROR
    naming the setting, and once the first ends a new one is accepted."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    listener = wait_listening(spawn_stomp_listener(servers["data_dir"], namespace, "conns-full", **FAST,
                                                   SIGNALBOX_CONNECTION_REGISTRY_LIMIT="1"))
    try:
        first = RawTcp(listener.port)
        first.connect()
        second = RawTcp(listener.port)
        second.send("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "secret", "host": "x"})
        error = second.expect("ERROR")
        assert "SIGNALBOX_CONNECTION_REGISTRY_LIMIT" in error.get("message") + error.body.decode()
        assert second.closed_within(5)
        second.close()
        first.send("DISCONNECT", {"receipt": "bye"})
        first.expect("RECEIPT")
        first.close()
        third = eventually(lambda: _connects(listener.port))
        third.close()
    finally:
        listener.stop()


def _connects(port: int) -> RawTcp | None:
    client = RawTcp(port)
    client.send("CONNECT", {"accept-version": "1.2", "login": "alice", "passcode": "secret", "host": "x"})
    if client.receive().command == "CONNECTED":
        return client
    client.close()
    return None


def test_killed_gateway_connections_leave_the_list(servers, api):
    """STOMP over WebSocket and the JSON protocol on a gateway process killed with SIGKILL: both entries go
    within a lease."""
    from websockets.sync.client import connect

    doomed = wait_listening(spawn_gateway(servers["data_dir"], servers["namespace"], "conns-doomed-gw",
                                          **FAST))
    tag = uuid.uuid4().hex[:6]
    stomp = RawStomp(f"ws://127.0.0.1:{doomed.port}/stomp")
    stomp.connect(**{"client_id": f"dying-ws-{tag}"})
    ws = connect(f"ws://127.0.0.1:{doomed.port}/ws/v1", open_timeout=5)
    ws.__enter__()  # the sync client warns when not used as a context manager
    ws.send(json.dumps({"type": "connect", "id": 1, "login": "alice", "passcode": "secret"}))
    connection = json.loads(ws.recv(5))["connection"]
    ids = {eventually(lambda: find(api, client=f"dying-ws-{tag}"))[0]["id"], connection}
    assert detail(api, connection)["protocol"] == "json-ws"
    doomed.kill()
    killed_at = time.monotonic()
    eventually(lambda: all(detail(api, i) is None for i in ids), timeout=LEASE_MS / 1000 + 3)
    assert time.monotonic() - killed_at < LEASE_MS / 1000 + 3
    with pytest.raises(Exception):  # noqa: B017 - whichever way the dead socket reports it
        stomp.receive(1)
    ws.close()


def test_rest_entry_lapses_with_its_consumer(api):
    queue = f"q{uuid.uuid4().hex[:8]}"
    consumer_id = api.post(f"/queues/{queue}/consumers", json={"lease_ms": 1000}).json()["consumer_id"]
    assert detail(api, consumer_id)["protocol"] == "rest"
    time.sleep(0.5)
    assert api.post(f"/queues/{queue}/consumers/{consumer_id}/heartbeat").status_code == 200
    assert detail(api, consumer_id) is not None
    # no request for longer than its lease (and the third more the entry gets): the entry is gone
    eventually(lambda: detail(api, consumer_id) is None, timeout=4)


def test_an_open_queue_browser_is_in_the_rest_apis_consumer_count(servers, api, broker):
    """GET /queues/<q> and the destination list count an open STOMP browser (browser:true) among the
    queue's consumers, as ActiveMQ's ConsumerCount does (`browsers` says how many of them are browsers),
    until it is unsubscribed."""
    queue = f"q{uuid.uuid4().hex[:8]}"
    client = RawTcp(servers["listener"].port)
    try:
        client.connect()
        client.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "b", "browser": "true",
                                  "receipt": "r"})
        client.expect("RECEIPT")
        assert client.expect("MESSAGE").get("browser") == "end"
        detail = api.get(f"/queues/{queue}").json()
        assert (detail["consumer_count"], detail["browsers"], detail["consumers"]) == (1, 1, [])
        [row] = api.get("/destinations", params={"kind": "queue", "search": queue}).json()["results"]
        assert row["consumer_count"] == 1
        client.send("UNSUBSCRIBE", {"id": "b", "receipt": "u"})
        client.expect("RECEIPT")
        assert api.get(f"/queues/{queue}").json()["consumer_count"] == 0
    finally:
        client.close()
