"""STOMP temporary destinations as ActiveMQ 5.17 has them, against real servers (a gateway process for STOMP
over WebSocket, a STOMP-over-TCP listener, one Redis namespace): `/temp-queue/<name>` is the connection's own
temporary queue, other connections see it (reply-to, destination) as `/remote-temp-queue/<id>` and may send
to it, only its connection may subscribe, and when that connection ends (DISCONNECT, or its client killed)
the queue goes with its messages, counted; a send to it afterwards is refused; a connection's count of
them is bounded by SIGNALBOX_TEMP_DESTINATION_LIMIT."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from broker_core.config.virtual import VirtualConfig
from broker_core.ops import virtual
from tests.helpers.gateway_server import ROOT
from tests.helpers.own_servers import own_servers_fixtures
from tests.helpers.polling import eventually
from tests.helpers.stomp_client import RawStomp, RawTcp, goes_on

pytestmark = pytest.mark.e2e

LIMIT = 3
SETTINGS = {"SIGNALBOX_CONNECTION_LEASE_MS": "1500", "SIGNALBOX_CONNECTION_POLL_SECONDS": "0.2",
            "SIGNALBOX_TEMP_DESTINATION_LIMIT": str(LIMIT)}


servers, api, broker = own_servers_fixtures("temps", **SETTINGS)


def tcp(servers: dict[str, Any]) -> RawTcp:
    conn = RawTcp(servers["listener"].port)
    conn.connect()
    return conn


def receipt(conn: Any, command: str, headers: dict[str, str], body: bytes = b"") -> None:
    tag = uuid.uuid4().hex[:8]
    conn.send(command, {**headers, "receipt": tag}, body)
    frame = conn.receive()
    assert frame.command == "RECEIPT" and frame.get("receipt-id") == tag, frame


def receipt_after_messages(conn: Any, command: str, headers: dict[str, str]) -> None:
    """`receipt` for a connection that may still be getting MESSAGEs (advisories): those are skipped."""
    tag = uuid.uuid4().hex[:8]
    conn.send(command, {**headers, "receipt": tag})
    while (frame := conn.receive()).command == "MESSAGE":
        pass
    assert frame.command == "RECEIPT" and frame.get("receipt-id") == tag, frame


def remote_name(servers: dict[str, Any], owner: Any, name: str) -> str:
    """The name other connections know `owner`'s /temp-queue/<name> by: the reply-to a request carries."""
    requests = f"req{uuid.uuid4().hex[:8]}"
    receipt(owner, "SEND", {"destination": f"/queue/{requests}", "reply-to": f"/temp-queue/{name}"}, b"q")
    reader = tcp(servers)
    reader.send("SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "r"})
    reply_to = reader.expect("MESSAGE").get("reply-to")
    receipt(reader, "DISCONNECT", {})
    reader.close()
    return reply_to


def test_request_reply_between_websocket_and_tcp_over_a_temp_queue(servers):
    requester = RawStomp(servers["gateway"].stomp_url)
    requester.connect()
    responder = tcp(servers)
    requests = f"req{uuid.uuid4().hex[:8]}"
    receipt(requester, "SUBSCRIBE", {"destination": "/temp-queue/replies", "id": "replies"})
    receipt(responder, "SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "work"})
    requester.send("SEND", {"destination": f"/queue/{requests}", "reply-to": "/temp-queue/replies",
                            "correlation-id": "c1"}, b"2+2")
    request = responder.expect("MESSAGE")
    reply_to = request.get("reply-to")
    # another connection sees it as ActiveMQ shows a temporary queue it did not create
    assert reply_to.startswith("/remote-temp-queue/ID:"), reply_to
    responder.send("SEND", {"destination": reply_to, "correlation-id": request.get("correlation-id")}, b"4")
    reply = requester.expect("MESSAGE")
    assert reply.body == b"4" and reply.get("correlation-id") == "c1"
    assert reply.get("destination") == "/temp-queue/replies"  # its own, by the name it gave
    assert reply.get("subscription") == "replies"
    for conn in (requester, responder):
        receipt(conn, "DISCONNECT", {})
        conn.close()


def test_a_user_without_permissions_may_use_temp_destinations(servers):
    """bob may read and write only queue://bob.>: his temporary queue is his all the same (ActiveMQ without a
    tempDestinationAuthorizationEntry checks nothing for them)."""
    bob = RawTcp(servers["listener"].port, login="bob")
    bob.connect()
    receipt(bob, "SUBSCRIBE", {"destination": "/temp-queue/answers", "id": "a"})
    receipt(bob, "SEND", {"destination": "/queue/bob.requests", "reply-to": "/temp-queue/answers"}, b"?")
    alice = tcp(servers)
    alice.send("SUBSCRIBE", {"destination": "/queue/bob.requests", "id": "r"})
    receipt(alice, "SEND", {"destination": alice.expect("MESSAGE").get("reply-to")}, b"!")
    assert bob.expect("MESSAGE").body == b"!"
    for conn in (bob, alice):
        receipt(conn, "DISCONNECT", {})
        conn.close()


def test_only_the_connection_that_created_it_may_subscribe(servers):
    owner = tcp(servers)
    name = remote_name(servers, owner, "mine")
    thief = tcp(servers)
    thief.send("SUBSCRIBE", {"destination": name, "id": "steal"})
    error = thief.expect("ERROR")
    assert error.get("message") == ("Subscribing to a temporary queue created by another connection is not "
                                    "permitted"), error
    assert goes_on(thief)  # (an ERROR ActiveMQ does not end the connection for)
    thief.close()
    # the owner may, by either name
    receipt(owner, "SUBSCRIBE", {"destination": name, "id": "own"})
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-queue/mine", "id": "own2"})
    # and the reserved name scheme is not reachable as a plain queue
    plain = tcp(servers)
    plain.send("SEND", {"destination": "/queue/" + name.rpartition("/")[2]}, b"x")
    assert "temporary destinations" in plain.expect("ERROR").body.decode()
    plain.close()
    receipt(owner, "DISCONNECT", {})
    owner.close()


def _fill(servers: dict[str, Any], owner: Any, name: str) -> tuple[str, RawTcp]:
    """Two messages from the owner to its own temporary queue, one from another connection to it."""
    remote = remote_name(servers, owner, name)
    receipt(owner, "SEND", {"destination": f"/temp-queue/{name}"}, b"own1")
    receipt(owner, "SEND", {"destination": f"/temp-queue/{name}"}, b"own2")
    sender = tcp(servers)
    receipt(sender, "SEND", {"destination": remote}, b"from another")
    return remote, sender


def _refused_after(sender: RawTcp, remote: str) -> None:
    sender.send("SEND", {"destination": remote, "receipt": "late"}, b"too late")
    error = sender.expect("ERROR")
    assert error.get("message") == f"temp-queue://{remote.rpartition('/')[2]}"
    assert error.body.decode().startswith("Destination does not exist")
    assert "ended" in error.body.decode() or "no temporary destination" in error.body.decode()
    sender.close()


def test_disconnect_deletes_the_temp_queue_and_counts_its_messages(servers, api, broker):
    owner = tcp(servers)
    remote, sender = _fill(servers, owner, "held")
    uri = "queue://" + remote.rpartition("/")[2]
    assert uri in broker.destinations() and broker.stats(uri).pending == 3
    # the REST destination list (the console's) shows it, marked temporary
    name = remote.rpartition("/")[2]
    listed = api.get("/destinations", params={"search": name})
    assert [(r["name"], r["temporary"], r["messages"]) for r in listed.json()["results"]] == [(name, True, 3)]
    before = broker.temp_tally()
    receipt(owner, "DISCONNECT", {})
    owner.close()
    after = eventually(lambda: (t := broker.temp_tally())["destinations"] > before["destinations"] and t)
    assert after == {"destinations": before["destinations"] + 1, "messages": before["messages"] + 3}
    assert uri not in broker.destinations()
    # the console's node page shows the counts
    node = api.get("/console/node").json()
    node = node["temporary_destinations"]
    assert (node["deleted"], node["deleted_messages"]) >= (after["destinations"], after["messages"])
    _refused_after(sender, remote)


_KILLED_CLIENT = """
import sys, time
from tests.helpers.stomp_client import RawTcp
conn = RawTcp(int(sys.argv[1]))
conn.connect()
conn.send("SEND", {"destination": "/queue/" + sys.argv[2], "reply-to": "/temp-queue/kept", "receipt": "r"},
          b"q")
assert conn.expect("RECEIPT").get("receipt-id") == "r"
print("ready", flush=True)
time.sleep(60)
"""


def test_a_killed_client_s_temp_queue_goes_with_its_messages_counted(servers, broker):
    requests = f"req{uuid.uuid4().hex[:8]}"
    client = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, str(servers["listener"].port), requests],
                              cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == b"ready"
        reader = tcp(servers)
        reader.send("SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "r"})
        remote = reader.expect("MESSAGE").get("reply-to")
        for i in range(4):
            receipt(reader, "SEND", {"destination": remote}, f"reply {i}".encode())
        uri = "queue://" + remote.rpartition("/")[2]
        assert broker.stats(uri).pending == 4
        before = broker.temp_tally()
    finally:
        client.kill()  # SIGKILL: the socket closes without a DISCONNECT
        client.wait(10)
    # (the listener sees the socket end at once; on a loaded machine the deletion may still take seconds)
    after = eventually(lambda: (t := broker.temp_tally())["destinations"] > before["destinations"] and t,
                       timeout=20)
    assert after == {"destinations": before["destinations"] + 1, "messages": before["messages"] + 4}
    assert uri not in broker.destinations()
    _refused_after(reader, remote)


def test_a_connection_s_temp_destinations_are_bounded_by_a_named_limit(servers, broker):
    conn = tcp(servers)
    for i in range(LIMIT):
        receipt(conn, "SUBSCRIBE", {"destination": f"/temp-queue/n{i}", "id": f"s{i}"})
    receipt(conn, "UNSUBSCRIBE", {"id": "s0"})
    receipt(conn, "SEND", {"destination": "/temp-queue/n0"}, b"same one: no new destination")
    conn.send("SUBSCRIBE", {"destination": "/temp-topic/one-more", "id": "over"})
    error = conn.expect("ERROR")
    assert "SIGNALBOX_TEMP_DESTINATION_LIMIT" in error.get("message") and str(LIMIT) in error.get("message")
    # the connection goes on with what it holds: one of its own again (which gets what was sent to it
    # meanwhile: the MESSAGE may come before the RECEIPT or after it), but still no new one
    conn.send("SUBSCRIBE", {"destination": "/temp-queue/n0", "id": "again", "receipt": "again"})
    frames = [conn.receive(), conn.receive()]
    assert sorted(f.command for f in frames) == ["MESSAGE", "RECEIPT"], frames
    assert [f.body for f in frames if f.command == "MESSAGE"] == [b"same one: no new destination"]
    conn.send("SUBSCRIBE", {"destination": "/temp-queue/another", "id": "over2"})
    assert "SIGNALBOX_TEMP_DESTINATION_LIMIT" in conn.expect("ERROR").get("message")
    conn.close()


def test_a_temp_topic_carries_replies_and_takes_no_durable_subscription(servers):
    owner = tcp(servers)
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-topic/events", "id": "ev"})
    requests = f"req{uuid.uuid4().hex[:8]}"
    receipt(owner, "SEND", {"destination": f"/queue/{requests}", "reply-to": "/temp-topic/events"}, b"q")
    other = tcp(servers)
    other.send("SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "r"})
    reply_to = other.expect("MESSAGE").get("reply-to")
    assert reply_to.startswith("/remote-temp-topic/ID:"), reply_to
    receipt(other, "SEND", {"destination": reply_to}, b"published")
    event = owner.expect("MESSAGE")
    assert (event.body, event.get("destination")) == (b"published", "/temp-topic/events")
    # ActiveMQ's TempTopicRegion refuses a durable subscription
    owner.send("SUBSCRIBE", {"destination": "/temp-topic/events", "id": "d",
                             "activemq.subscriptionName": "d"})
    error = owner.expect("ERROR")
    assert error.get("message") == "A durable subscription cannot be created for a temporary topic."
    owner.close()
    receipt(other, "DISCONNECT", {})
    other.close()


def test_wildcard_subscriptions_never_receive_what_a_temp_topic_carries(servers):
    """ActiveMQ matches wildcards within one destination type (DestinationFilter's destinationType,
    DestinationMap's separate temp roots): another connection's `/topic/>`, `/topic/*` or durable `/topic/>`
    never gets the replies sent to someone's temporary topic. A sentinel sent to an ordinary topic after
    them is the first message each wildcard subscription sees (advisories aside)."""
    owner = tcp(servers)
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-topic/replies", "id": "own"})
    requests = f"req{uuid.uuid4().hex[:8]}"
    receipt(owner, "SEND", {"destination": f"/queue/{requests}", "reply-to": "/temp-topic/replies"}, b"q")
    spy = RawTcp(servers["listener"].port)
    spy.connect(**{"client-id": f"spy{uuid.uuid4().hex[:8]}"})
    receipt(spy, "SUBSCRIBE", {"destination": "/topic/>", "id": "all"})
    receipt(spy, "SUBSCRIBE", {"destination": "/topic/*", "id": "one"})
    receipt(spy, "SUBSCRIBE", {"destination": "/topic/>", "id": "durable",
                               "activemq.subscriptionName": "everything"})
    responder = tcp(servers)
    responder.send("SUBSCRIBE", {"destination": f"/queue/{requests}", "id": "r"})
    reply_to = responder.expect("MESSAGE").get("reply-to")
    receipt(responder, "SEND", {"destination": reply_to}, b"secret reply")
    assert owner.expect("MESSAGE").body == b"secret reply"
    sentinel = f"sentinel{uuid.uuid4().hex[:8]}"
    receipt(responder, "SEND", {"destination": f"/topic/{sentinel}"}, b"sentinel")
    seen = {}
    while len(seen) < 3:
        frame = spy.expect("MESSAGE")
        if frame.get("destination").startswith("/topic/ActiveMQ.Advisory."):
            continue  # (advisories are ordinary topics: `>` and `*` match them, as in ActiveMQ)
        assert frame.body == b"sentinel", (frame.get("subscription"), frame.get("destination"), frame.body)
        seen[frame.get("subscription")] = frame.get("destination")
    assert seen == {s: f"/topic/{sentinel}" for s in ("all", "one", "durable")}
    receipt_after_messages(spy, "UNSUBSCRIBE", {"id": "durable"})
    receipt_after_messages(spy, "UNSUBSCRIBE", {"id": "durable", "activemq.subscriptionName": "everything"})
    for conn in (owner, spy, responder):
        receipt_after_messages(conn, "DISCONNECT", {})
        conn.close()


Advisories = list[tuple[str, dict[str, Any]]]


def _advisories_until(conn: RawTcp, done: Callable[[Advisories], bool], settle: float = 0.5,
                      got: Advisories | None = None) -> Advisories:
    """(subscription, JSON body) of the advisories `conn` gets until `done` says enough, then any more
    within `settle` seconds (what should not come would come about as soon)."""
    got = [] if got is None else got
    while not done(got):
        frame = conn.expect("MESSAGE")
        got.append((frame.get("subscription"), json.loads(frame.body)))
    deadline = time.monotonic() + settle
    while (left := deadline - time.monotonic()) > 0:
        try:
            frame = conn.expect("MESSAGE", timeout=left)
        except TimeoutError:
            break
        got.append((frame.get("subscription"), json.loads(frame.body)))
    return got


def _watch(conn: RawTcp, topics: dict[str, str]) -> Advisories:
    """Subscribe `conn` to each advisory topic (id: name) and return what it is told of the present: a new
    advisory subscriber's replay (AdvisoryBroker.addConsumer), which comes after the RECEIPT."""
    got: Advisories = []
    for sub_id, name in topics.items():
        conn.send("SUBSCRIBE", {"destination": f"/topic/ActiveMQ.Advisory.{name}", "id": sub_id,
                                "receipt": sub_id})
        while (frame := conn.receive()).command == "MESSAGE":
            got.append((frame.get("subscription"), json.loads(frame.body)))
        assert frame.command == "RECEIPT" and frame.get("receipt-id") == sub_id, frame
    return _advisories_until(conn, lambda _: True, got=got)


def _destination_infos(got: Advisories, operation: int) -> list[tuple[str, str]]:
    return sorted((s, b["DestinationInfo"]["destination"]) for s, b in got
                  if "DestinationInfo" in b and b["DestinationInfo"]["operationType"] == operation)


def test_temp_destination_advisories_are_activemq_s(servers):
    """AdvisorySupport.getDestinationAdvisoryTopic: a temporary queue's creation and deletion go to
    ActiveMQ.Advisory.TempQueue, a temporary topic's to ActiveMQ.Advisory.TempTopic, never to
    ActiveMQ.Advisory.Queue / .Topic, and name it by its qualified name (temp-queue://ID:...); a new
    subscriber of TempQueue is told of the live temporary queues, one of Queue of none of them. Consumer
    advisories keep getConsumerAdvisoryTopic's topic (ActiveMQTempQueue.isQueue():
    ActiveMQ.Advisory.Consumer.Queue.<name>)."""
    watcher = tcp(servers)
    topics = ("TempQueue", "TempTopic", "Queue", "Topic")
    _watch(watcher, {name: name for name in topics} | {"cons": "Consumer.Queue.>"})
    owner = tcp(servers)
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-queue/a", "id": "a"})
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-topic/b", "id": "b"})
    sentinel = f"sentinel{uuid.uuid4().hex[:8]}"
    receipt(owner, "SEND", {"destination": f"/queue/{sentinel}"}, b"creates an ordinary queue")

    def created(got: Advisories) -> bool:
        subs = {s for s, _ in _destination_infos(got, 0)}
        return {"Queue", "TempQueue", "TempTopic"} <= subs and any(s == "cons" for s, _ in got)

    got = _advisories_until(watcher, created)
    added = _destination_infos(got, 0)
    assert [i for i in added if i[0] in ("Queue", "Topic")] == [("Queue", f"queue://{sentinel}")], added
    temps = {s: d for s, d in added if s.startswith("Temp")}
    assert temps["TempQueue"].startswith("temp-queue://ID:tcp-"), temps
    assert temps["TempTopic"].startswith("temp-topic://ID:tcp-"), temps
    consumer = [b["ConsumerInfo"] for s, b in got if s == "cons"]
    assert [c["destination"] for c in consumer] == [temps["TempQueue"]], got
    # a late subscriber is told of the temporary queue on TempQueue only
    late = tcp(servers)
    told = _watch(late, {"TempQueue": "TempQueue", "Queue": "Queue"})
    assert ("TempQueue", temps["TempQueue"]) in _destination_infos(told, 0), told
    assert not [i for i in _destination_infos(told, 0) if i[0] == "Queue" and "ID:" in i[1]], told
    assert not [i for i in _destination_infos(told, 0) if i[0] == "TempQueue" and "ID:" not in i[1]], told
    receipt(owner, "DISCONNECT", {})
    owner.close()
    gone = _advisories_until(watcher, lambda got: len(_destination_infos(got, 1)) >= 2)
    assert _destination_infos(gone, 1) == sorted(temps.items()), gone
    assert [s for s, b in gone if "RemoveInfo" in b] == ["cons"], gone
    for conn in (watcher, late):
        receipt_after_messages(conn, "DISCONNECT", {})
        conn.close()


def test_virtual_destination_patterns_never_copy_a_temp_destination_s_messages(servers, broker):
    """ActiveMQ's VirtualDestinationInterceptor looks composites and virtual topics up in a DestinationMap,
    whose temporary destinations are a root of their own: a composite on `>` (queue or topic) or a virtual
    topic on `>` copies nothing sent to a temporary queue or topic. An ordinary destination's sentinel, sent
    after, is the first copy each gets."""
    spy = f"spy{uuid.uuid4().hex[:8]}"
    owner = tcp(servers)
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-topic/t", "id": "t"})
    receipt(owner, "SUBSCRIBE", {"destination": "/temp-queue/q", "id": "q"})
    queue_name = remote_name(servers, owner, "q")
    topic_name = queue_name.replace("-queue/", "-topic/").rpartition(":")[0] + ":1"  # (created first)
    # what would be the virtual topic's consumer queue for the temporary topic, there before the reply
    consumer_queue = f"/queue/{spy}.x.{topic_name.rpartition('/')[2]}"
    reader = tcp(servers)
    receipt(reader, "SEND", {"destination": consumer_queue}, b"made")
    virtual.configure(broker, VirtualConfig.from_config({
        "compositeTopic": [{"name": ">", "forwardOnly": False, "forwardTo": [f"{spy}.topics"]}],
        "compositeQueue": [{"name": ">", "forwardOnly": False, "forwardTo": [f"{spy}.queues"]}],
        "virtualTopic": [{"name": ">", "prefix": f"{spy}.*."}]}))
    try:
        time.sleep(1.2)  # every process reads the configuration again within a second (CHECK_INTERVAL_S)
        receipt(reader, "SEND", {"destination": topic_name}, b"secret topic reply")
        receipt(reader, "SEND", {"destination": queue_name}, b"secret queue reply")
        assert sorted(owner.expect("MESSAGE").body for _ in range(2)) == [b"secret queue reply",
                                                                            b"secret topic reply"]
        receipt(reader, "SEND", {"destination": f"/topic/{spy}sentinel"}, b"sentinel")
        receipt(reader, "SEND", {"destination": f"/queue/{spy}sentinel"}, b"sentinel")
        for queue, first in ((f"{spy}.topics", b"sentinel"), (f"{spy}.queues", b"sentinel"),
                             (consumer_queue.removeprefix("/queue/"), b"made")):
            look = tcp(servers)
            look.send("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "look"})
            while (frame := look.expect("MESSAGE")).body.startswith(b"{"):
                pass  # (an advisory's copy: advisory topics are ordinary topics)
            assert frame.body == first, (queue, frame)
            receipt_after_messages(look, "DISCONNECT", {})
            look.close()
        for conn in (owner, reader):
            receipt_after_messages(conn, "DISCONNECT", {})
            conn.close()
    finally:
        virtual.configure(broker, VirtualConfig.from_config({}))
        time.sleep(1.2)
