"""STOMP queue browsing (SUBSCRIBE browser:true), as ActiveMQ 5.17.2's StompQueueBrowserSubscription, through
a real STOMP-over-TCP listener whose browse pages are 2 messages (SIGNALBOX_WS_BROWSE_PAGE), so a few
messages already take several broker calls. What ActiveMQ does was seen on it: every message on the queue
(selector applied) as MESSAGE frames, then one MESSAGE with `browser:end`, `destination`, `message-id:0`
and `subscription` and no body; the messages stay; nothing more arrives until UNSUBSCRIBE; STOMP 1.0 is
refused; at most the policy's maxBrowsePageSize messages."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.helpers.gateway_server import spawn_stomp_listener, wait_listening
from tests.helpers.polling import eventually
from tests.helpers.stomp_client import RawStomp, RawTcp, goes_on

pytestmark = pytest.mark.e2e

BROWSE_PAGE = 2


@pytest.fixture(scope="module")
def browse_listener(gateway_data):
    data_dir, namespace = gateway_data
    server = wait_listening(spawn_stomp_listener(data_dir, namespace, "browse",
                                                 SIGNALBOX_WS_BROWSE_PAGE=str(BROWSE_PAGE)))
    yield server
    server.stop()
    output = server.output()
    assert "Traceback" not in output, output


@pytest.fixture
def raw(browse_listener):
    made: list[RawTcp] = []

    def make(login: str = "alice", version: str = "1.2") -> RawTcp:
        conn = RawTcp(browse_listener.port, login=login)
        made.append(conn)
        conn.connect(**{"accept-version": version})
        return conn

    yield make
    for conn in made:
        conn.close()


def _name() -> str:
    return f"browse{uuid.uuid4().hex[:10]}"


def _fill(conn: RawTcp, dest: str, count: int, **headers: str) -> None:
    for n in range(count):
        color = "red" if n % 2 == 0 else "blue"
        conn.send("SEND", {"destination": dest, "n": str(n), "color": color, "receipt": f"s{n}", **headers},
                  f"body {n}".encode())
        conn.expect("RECEIPT")


def _browse(conn: RawTcp, dest: str, sub: str = "b", **headers: str) -> list:
    """SUBSCRIBE browser:true with a receipt; the frames after the RECEIPT up to and with the end frame."""
    conn.send("SUBSCRIBE", {"destination": dest, "id": sub, "browser": "true", "receipt": f"sub-{sub}",
                            **headers})
    assert conn.expect("RECEIPT").get("receipt-id") == f"sub-{sub}"
    frames = []
    while True:
        frame = conn.expect("MESSAGE")
        frames.append(frame)
        if frame.get("browser") is not None:
            return frames


def _end_frame(dest: str, sub: str) -> list[tuple[str, str]]:
    return [("browser", "end"), ("destination", dest), ("message-id", "0"), ("subscription", sub)]


def test_a_browse_gives_every_message_across_pages_then_the_end_and_leaves_them(raw, broker):
    conn = raw()
    name = _name()
    dest = f"/queue/{name}"
    _fill(conn, dest, 2 * BROWSE_PAGE + 1)  # one past a page boundary
    frames = _browse(conn, dest)
    *messages, end = frames
    assert [m.get("n") for m in messages] == ["0", "1", "2", "3", "4"]
    assert [m.body for m in messages] == [f"body {n}".encode() for n in range(5)]
    assert all(m.get("subscription") == "b" and m.get("destination") == dest for m in messages)
    assert all(m.get("ack") is None for m in messages)  # ack mode auto: nothing to acknowledge
    assert list(end.headers) == _end_frame(dest, "b") and end.body == b""
    stats = broker.stats(f"queue://{name}")
    assert (stats.queue_size, stats.in_flight, stats.dequeued) == (5, 0, 0)
    # nothing more after the end (ActiveMQ's browser is done), until UNSUBSCRIBE ends the subscription
    _fill(conn, dest, 1)
    conn.send("UNSUBSCRIBE", {"id": "b", "receipt": "u"})
    assert conn.expect("RECEIPT").get("receipt-id") == "u"
    assert broker.stats(f"queue://{name}").queue_size == 6


def test_a_browse_applies_the_selector(raw):
    conn = raw()
    dest = f"/queue/{_name()}"
    _fill(conn, dest, 5)
    *messages, end = _browse(conn, dest, selector="color = 'red'")
    assert [m.get("n") for m in messages] == ["0", "2", "4"]
    assert end.get("browser") == "end"
    *messages, _end = _browse(conn, dest, "numeric", selector="n > 2")  # STOMP's string coercion
    assert [m.get("n") for m in messages] == ["3", "4"]


def test_an_empty_queue_gives_just_the_end_frame(raw):
    conn = raw()
    dest = f"/queue/{_name()}"
    frames = _browse(conn, dest, "e")
    assert len(frames) == 1 and list(frames[0].headers) == _end_frame(dest, "e") and frames[0].body == b""


def test_a_browse_sees_at_most_the_policys_max_browse_page_size(raw, broker):
    name = _name()
    broker.policies.set_entry("queue", name, {"maxBrowsePageSize": 3})
    conn = raw()
    dest = f"/queue/{name}"
    _fill(conn, dest, 5)
    *messages, end = _browse(conn, dest)
    assert [m.get("n") for m in messages] == ["0", "1", "2"]
    assert end.get("browser") == "end"


def test_browsing_is_refused_to_stomp_1_0(raw):
    conn = raw(version="1.0")
    conn.send("SUBSCRIBE", {"destination": f"/queue/{_name()}", "browser": "true", "receipt": "r"})
    error = conn.expect("ERROR")
    assert error.get("message") == "Queue Browser feature only valid for Stomp v1.1+ clients!"
    assert error.get("receipt-id") == "r"
    assert goes_on(conn)


def test_browser_true_is_case_sensitive_as_activemqs(raw, broker):
    """ActiveMQ compares the header with "true" exactly: `browser:TRUE` subscribes a plain consumer."""
    conn = raw()
    name = _name()
    _fill(conn, f"/queue/{name}", 1)
    conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "c", "browser": "TRUE"})
    assert conn.expect("MESSAGE").get("browser") is None
    conn.send("DISCONNECT", {"receipt": "bye"})
    conn.expect("RECEIPT")
    assert broker.stats(f"queue://{name}").dequeued == 1


def test_a_browser_on_a_topic_is_refused(raw):
    conn = raw()
    conn.send("SUBSCRIBE", {"destination": f"/topic/{_name()}", "id": "t", "browser": "true", "receipt": "r"})
    error = conn.expect("ERROR")
    assert error.get("receipt-id") == "r" and "queue" in error.get("message", "")
    assert goes_on(conn)


def test_acks_on_a_browser_acknowledge_nothing_and_a_nack_is_refused(raw, broker):
    conn = raw()
    name = _name()
    dest = f"/queue/{name}"
    _fill(conn, dest, 3)
    *messages, _end = _browse(conn, dest, ack="client-individual")
    assert all(m.get("ack") for m in messages)
    conn.send("ACK", {"id": messages[0].get("ack"), "receipt": "a"})
    assert conn.expect("RECEIPT").get("receipt-id") == "a"
    conn.send("NACK", {"id": messages[1].get("ack"), "receipt": "n"})
    error = conn.expect("ERROR")
    assert error.get("message") == "Cannot Nack a message on a Queue Browser Subscription."
    assert error.get("receipt-id") == "n"
    assert goes_on(conn)
    stats = broker.stats(f"queue://{name}")
    assert (stats.queue_size, stats.dequeued) == (3, 0)


def test_browsing_needs_read_permission(raw):
    conn = raw(login="bob")  # bob reads queue://bob.> only
    conn.send("SUBSCRIBE", {"destination": f"/queue/{_name()}", "id": "b", "browser": "true", "receipt": "r"})
    error = conn.expect("ERROR")
    assert error.get("message", "").startswith("User bob is not authorized to read from")
    conn.send("SUBSCRIBE", {"destination": f"/queue/bob.{_name()}", "id": "b", "browser": "true",
                            "receipt": "r2"})
    assert conn.expect("RECEIPT").get("receipt-id") == "r2"
    assert conn.expect("MESSAGE").get("browser") == "end"


def test_a_browse_over_websocket_in_stomp_1_1_with_client_acks(gateway, broker):
    """The session is the WebSocket endpoint's too; STOMP 1.1 acks by message-id, `client` cumulatively."""
    conn = RawStomp(gateway.stomp_url, version="1.1")
    try:
        conn.connect(version="1.1")
        name = _name()
        dest = f"/queue/{name}"
        for n in range(3):
            conn.send("SEND", {"destination": dest, "n": str(n), "receipt": f"s{n}"}, f"body {n}".encode())
            conn.expect("RECEIPT")
        conn.send("SUBSCRIBE", {"destination": dest, "id": "w", "browser": "true", "ack": "client"})
        messages = [conn.expect("MESSAGE") for _ in range(3)]
        assert [m.get("n") for m in messages] == ["0", "1", "2"]
        end = conn.expect("MESSAGE")
        assert list(end.headers) == _end_frame(dest, "w") and end.body == b""
        conn.send("ACK", {"message-id": messages[2].get("message-id"), "subscription": "w", "receipt": "a"})
        assert conn.expect("RECEIPT").get("receipt-id") == "a"
        assert broker.stats(f"queue://{name}").queue_size == 3
    finally:
        conn.close()


def test_a_connection_browses_its_own_temporary_queue_not_anothers(raw):
    owner, other = raw(), raw()
    owner.send("SEND", {"destination": "/temp-queue/mine", "receipt": "t"}, b"kept")
    owner.expect("RECEIPT")
    *messages, end = _browse(owner, "/temp-queue/mine")
    assert [m.body for m in messages] == [b"kept"]
    assert list(end.headers) == _end_frame("/temp-queue/mine", "b")  # by the name this connection gave it
    name = _name()
    owner.send("SEND", {"destination": f"/queue/{name}", "reply-to": "/temp-queue/mine", "receipt": "r"},
               b"q")
    owner.expect("RECEIPT")
    other.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "c"})
    remote = other.expect("MESSAGE").get("reply-to")
    assert remote is not None and remote.startswith("/remote-temp-queue/")
    other.send("SUBSCRIBE", {"destination": remote, "id": "b", "browser": "true", "receipt": "x"})
    error = other.expect("ERROR")
    assert error.get("message") == ("Subscribing to a temporary queue created by another connection is not "
                                    "permitted")
    assert goes_on(other)


@pytest.mark.parametrize(("ack", "prefetch", "rounds"), [
    ("client-individual", "1", [["body 0"], ["body 1"], ["body 2"], ["end"]]),
    ("client", "2", [["body 0", "body 1"], ["body 2", "end"]]),
])
def test_a_client_ack_browser_is_given_at_most_its_prefetch_unacknowledged(raw, ack, prefetch, rounds):
    """As ActiveMQ's browser (a consumer with a prefetch: activemq.prefetchSize, else 500): in a `client`
    ack mode its messages count against the prefetch until acknowledged, the end frame too, so a client
    that asks for one at a time gets one at a time (seen on ActiveMQ 5.17.2: these rounds exactly); it
    was given the whole browse at once."""
    conn = raw()
    dest = f"/queue/{_name()}"
    _fill(conn, dest, 3)
    conn.send("SUBSCRIBE", {"destination": dest, "id": "b", "browser": "true", "ack": ack,
                            "activemq.prefetchSize": prefetch})
    for expected in rounds:
        got = [conn.expect("MESSAGE") for _ in expected]
        assert [f.body.decode() or f.get("browser") for f in got] == expected
        assert goes_on(conn)  # (nothing more until an ACK)
        if got[-1].get("ack"):
            conn.send("ACK", {"id": got[-1].get("ack")})


def test_a_browse_looks_at_most_at_max_browse_page_size_messages_matching_or_not(raw, broker, redis_client):
    """ActiveMQ's browser sees one page-in of the queue, selector or not: with 450 messages and a selector
    that matches only the last 10, ActiveMQ 5.17.2 gave none, just the end frame. The walk went on to the
    end of the queue until it had found maxBrowsePageSize matches: one SUBSCRIBE with a selector matching
    nothing on a queue of a million messages made 2,500 browse calls of several ms each, and a connection
    may hold 1,000 browsers. It looks at maxBrowsePageSize messages at most, as many calls as that takes."""
    from broker_core.messages import Message

    def script_calls() -> int:
        stats = redis_client.info("commandstats")
        return sum(stats.get(f"cmdstat_{n}", {}).get("calls", 0) for n in ("evalsha", "eval", "fcall"))

    name = _name()
    broker.policies.set_entry("queue", name, {"maxBrowsePageSize": 10})
    broker.send(name, [Message(body=f"m{n}", properties={"n": n}) for n in range(30)])
    conn = raw()
    dest = f"/queue/{name}"
    *messages, _end = _browse(conn, dest, "late", selector="n >= 20")
    assert messages == []
    *messages, _end = _browse(conn, dest, "some", selector="n >= 7")
    assert [m.get("n") for m in messages] == ["7", "8", "9"]
    big = _name()
    broker.send(big, [Message(body="x", properties={"n": n}) for n in range(8_000)])
    before = script_calls()
    *messages, _end = _browse(conn, f"/queue/{big}", "none", selector="n < 0")
    assert messages == [] and script_calls() - before <= 4


def test_an_open_browser_counts_among_the_queues_consumers_until_it_ends(raw, broker):
    """ActiveMQ's ConsumerCount counts a QueueBrowserSubscription while it is open (after its end frame
    too): so do the queue's stats (the REST API's, the CLI's and the metrics' read them). It is no consumer
    of the queue's (`consumers` lists none) and stops counting at UNSUBSCRIBE and at DISCONNECT, at once, not
    when a lease lapses (30 s)."""
    name = _name()
    dest = f"/queue/{name}"
    first, second = raw(), raw()
    _fill(first, dest, 1)
    _browse(first, dest, "b1")
    _browse(second, dest, "b2", selector="n = 0")
    stats = broker.stats(f"queue://{name}")
    assert (stats.consumer_count, stats.browsers, stats.consumers) == (2, 2, [])
    assert (stats.pending, stats.in_flight) == (1, 0)  # (nothing dispatched to them)
    first.send("UNSUBSCRIBE", {"id": "b1", "receipt": "u"})
    assert first.expect("RECEIPT").get("receipt-id") == "u"
    assert broker.stats(f"queue://{name}").consumer_count == 1
    second.send("DISCONNECT", {"receipt": "bye"})
    second.expect("RECEIPT")
    eventually(lambda: broker.stats(f"queue://{name}").consumer_count == 0, timeout=5)


def test_a_new_consumer_advisory_subscriber_is_told_of_the_open_browsers(raw):
    """ActiveMQ's AdvisoryBroker replays every ConsumerInfo it holds to a new subscriber of a consumer
    advisory topic, a QueueBrowserSubscription's (browser=true) among them, with the count that has it."""
    name = _name()
    dest = f"/queue/{name}"
    browsing, consuming = raw(), raw()
    _browse(browsing, dest, "b1")
    _browse(browsing, dest, "b2", selector="n = 0", **{"activemq.prefetchSize": "7"})
    consuming.send("SUBSCRIBE", {"destination": dest, "id": "c", "receipt": "c"})
    consuming.expect("RECEIPT")
    watcher = raw()
    watcher.send("SUBSCRIBE", {"destination": f"/topic/ActiveMQ.Advisory.Consumer.Queue.{name}", "id": "adv"})
    replayed = [watcher.expect("MESSAGE") for _ in range(3)]
    assert [m.get("consumerCount") for m in replayed] == ["3", "3", "3"]
    infos = sorted((json.loads(m.body)["ConsumerInfo"] for m in replayed), key=lambda i: str(i["selector"]))
    # (a STOMP selector as ActiveMQ's ConsumerInfo holds it: its ProtocolConverter prefixes it)
    assert [(i["browser"], str(i["selector"])) for i in infos] == [
        (False, "None"), (True, "None"), (True, "convert_string_expressions:n = 0")]
    assert infos[2]["prefetchSize"] == 7
    with pytest.raises(TimeoutError):  # nothing more
        watcher.receive(0.3)
