"""STOMP over WebSocket against a live gateway process, with stomp.py's WebSocket transport (a real client
over a real socket): every frame, ActiveMQ's headers, each ack mode, transactions, receipts, heart-beats,
groups, exclusive consumers, priorities, prefetch windows and selectors in coercion mode. STOMP 1.0/1.1
and exact bytes go through a raw WebSocket client."""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.helpers.gateway_server import ALICE_TOKEN
from tests.helpers.stomp_client import RawStomp, goes_on

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["ws", "tcp", "ws-port"])
def stomp_transport(request) -> str:
    """Every test with `clients` runs over the web server's WebSocket, over TCP and over the STOMP
    listener's WebSocket port: one session code, three transports."""
    return request.param


def q(name: str) -> str:
    return f"/queue/{name}"


# -- connecting ---------------------------------------------------------------------------------------

def test_connected_names_version_session_server_and_heart_beat(clients, stomp_transport):
    client = clients()
    headers = client.listener.connected
    assert headers["version"] == "1.2"
    # the connection id, named for its transport
    assert headers["session"].startswith({"ws": "ws-", "tcp": "tcp-", "ws-port": "ws-"}[stomp_transport])
    assert headers["server"].startswith("Signalbox/")
    assert headers["heart-beat"] == "0,0"


@pytest.mark.parametrize("login", ["alice", ""])
def test_an_api_token_is_a_passcode_with_or_without_the_login(clients, login):
    assert clients(login, ALICE_TOKEN).listener.connected["version"] == "1.2"


def test_a_wrong_password_gets_activemqs_error_and_the_connection_closes(clients):
    client = clients(connect=False)
    client.conn.connect("alice", "wrong", wait=False)
    error = client.expect("ERROR")
    assert error.headers["message"] == "User name [alice] or password is invalid."
    assert client.expect("DISCONNECTED")


def test_the_highest_offered_subprotocol_is_chosen(gateway):
    raw = RawStomp(gateway.stomp_url, subprotocols=["v10.stomp", "v11.stomp"])
    try:
        assert raw.subprotocol == "v11.stomp"
    finally:
        raw.close()


@pytest.mark.parametrize(("offered", "chosen"), [(["stomp"], "stomp"), (["stomp", "v11.stomp"], "v11.stomp")])
def test_the_plain_stomp_subprotocol_is_accepted_below_the_versioned_ones(gateway, offered, chosen):
    """ActiveMQ's WSServlet knows `stomp` too, below `v10.stomp`: a client that offers only it is answered
    with it, and then CONNECT's accept-version decides."""
    raw = RawStomp(gateway.stomp_url, subprotocols=offered)
    try:
        assert raw.subprotocol == chosen
        assert raw.connect().get("version") == "1.2"
    finally:
        raw.close()


def test_an_unsupported_version_is_refused_with_the_supported_list(gateway):
    raw = RawStomp(gateway.stomp_url)
    try:
        raw.send("CONNECT", {"accept-version": "2.0", "login": "alice", "passcode": "secret"})
        error = raw.expect("ERROR")
        assert error.get("version") == "1.0,1.1,1.2"
        assert raw.closed_within(3)
    finally:
        raw.close()


def test_frames_before_connect_are_refused_and_connect_still_works(gateway):
    """ActiveMQ's `Not connected.` is not fatal: the connection waits for its CONNECT."""
    raw = RawStomp(gateway.stomp_url)
    try:
        raw.send("SEND", {"destination": "/queue/x", "receipt": "early"}, b"early")
        error = raw.expect("ERROR")
        assert (error.get("message"), error.get("receipt-id")) == ("Not connected.", "early")
        raw.connect()
        assert goes_on(raw)
    finally:
        raw.close()


# -- SEND headers and MESSAGE headers -----------------------------------------------------------------

ACTIVEMQ_HEADERS = {"message-id", "destination", "subscription", "ack", "expires", "priority", "timestamp",
                    "persistent", "correlation-id", "reply-to", "type", "content-length"}


def test_message_headers_are_exactly_activemqs_set(clients, queue_name):
    client = clients()
    expires = int(time.time() * 1000) + 600_000
    client.receipt(client.conn.subscribe, q(queue_name), id="s1", ack="client-individual")
    client.conn.send(q(queue_name), "payload", headers={
        "persistent": "true", "priority": "7", "expires": str(expires), "type": "order",
        "correlation-id": "corr-1", "reply-to": "/queue/replies", "JMSXGroupID": "cart", "JMSXGroupSeq": "1",
        "region": "eu"})
    message = client.expect("MESSAGE")
    headers = message.headers
    assert set(headers) == ACTIVEMQ_HEADERS | {"region"}
    assert headers["persistent"] == "true"
    assert headers["priority"] == "7"
    assert headers["expires"] == str(expires)
    assert headers["type"] == "order"
    assert headers["correlation-id"] == "corr-1"
    assert headers["reply-to"] == "/queue/replies"
    assert headers["region"] == "eu"
    assert headers["ack"] == headers["message-id"]
    assert headers["message-id"].startswith("ID:")
    assert abs(int(headers["timestamp"]) - time.time() * 1000) < 60_000
    assert message.body == b"payload"


def test_defaults_non_persistent_priority_4_never_expires(gateway, queue_name):
    raw = RawStomp(gateway.stomp_url)
    try:
        raw.connect()
        raw.send("SUBSCRIBE", {"destination": q(queue_name), "id": "s", "receipt": "r"})
        raw.expect("RECEIPT")
        raw.send("SEND", {"destination": q(queue_name)}, b"text body")
        message = raw.expect("MESSAGE")
        headers = message.header_dict()
        assert "persistent" not in headers and "redelivered" not in headers
        assert headers["priority"] == "4" and headers["expires"] == "0"
        assert "content-length" not in headers  # a text message, as ActiveMQ sends a TextMessage
        assert "ack" not in headers  # auto mode
        assert message.body == b"text body"
    finally:
        raw.close()


def test_timestamp_expires_and_client_id_reach_the_broker(queue_name, broker, gateway):
    from tests.helpers.stomp_client import Client

    client = Client(gateway.port).connect(**{"client-id": "orders-app"})
    try:
        client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual",
                       headers={"activemq.retroactive": "true", "activemq.maximumPendingMessageLimit": "10"})
        (consumer,) = broker.stats(f"queue://{queue_name}").consumers
        assert consumer.client_id == "orders-app"
        client.conn.send(q(queue_name), "expired", headers={"expires": "1000"})  # 1970: expired on arrival
        client.conn.send(q(queue_name), "stamped", headers={"timestamp": "1234567890"})
        message = client.expect("MESSAGE")
        assert message.body == b"stamped" and message.headers["timestamp"] == "1234567890"
        assert broker.stats(f"queue://{queue_name}").expired_on_arrival == 1
    finally:
        client.close()


def test_group_headers_only_for_a_subscriber_that_asks(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s1",
                   headers={"signalbox.groupHeaders": "true"})
    for _ in range(2):
        client.conn.send(q(queue_name), "x", headers={"JMSXGroupID": "cart-7"})
    first, second = client.messages(2)
    assert first.headers["JMSXGroupID"] == "cart-7"
    assert first.headers["JMSXGroupSeq"] == "0"
    assert first.headers["JMSXGroupFirstForConsumer"] == "true"
    assert second.headers["JMSXGroupFirstForConsumer"] == "false"


def test_binary_bodies_with_nul_octets_travel_with_content_length(clients, queue_name):
    client = clients(binary_mode=True)  # bytes that are not UTF-8 need binary WebSocket messages
    client.receipt(client.conn.subscribe, q(queue_name), id="s1")
    body = bytes(range(256)) * 4
    client.conn.send(q(queue_name), body)
    message = client.expect("MESSAGE")
    assert message.body == body
    assert message.headers["content-length"] == str(len(body))


def test_schedule_headers_park_the_message_and_an_invalid_cron_is_refused(clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s")
    client.receipt(client.conn.send, q(queue_name), "later", headers={"AMQ_SCHEDULED_DELAY": "60000"})
    assert client.silent(0.3)
    (parked,) = broker.browse(f"queue://{queue_name}").messages
    assert parked.state == "parked" and parked.message.body == b"later"
    assert "AMQ_SCHEDULED_DELAY" not in parked.message.properties
    client.receipt(client.conn.send, q(queue_name), "hourly", headers={"AMQ_SCHEDULED_CRON": "0 * * * *"})
    assert {(b.message.body, b.state) for b in broker.browse(f"queue://{queue_name}").messages} == {
        (b"later", "parked"), (b"hourly", "parked")}
    client.conn.send(q(queue_name), "x", headers={"AMQ_SCHEDULED_CRON": "0 25 * * *"})
    error = client.expect("ERROR")
    assert "(AMQ_SCHEDULED_CRON) '0 25 * * *': the hour field '25' is outside 0-24" in error.body.decode()


def test_a_composite_send_reaches_every_queue(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, f"{q(queue_name)}.a,{q(queue_name)}.b", id="both")
    client.conn.send(f"{q(queue_name)}.a,{q(queue_name)}.b", "to both")
    destinations = sorted(m.headers["destination"] for m in client.messages(2))
    assert destinations == [f"{q(queue_name)}.a", f"{q(queue_name)}.b"]


def test_an_ack_acknowledges_only_the_subscription_whose_message_it_names(clients, queue_name, broker):
    """A composite send gives two subscriptions of one connection the same message id. STOMP 1.2 relates
    an ACK to its MESSAGE by the ack header alone, so each delivery needs its own (ActiveMQ generates one
    per delivery): a shared one let the ACK of subscription b's copy take subscription a's, and in
    `client` mode everything a had delivered before it, never acknowledged by the client."""
    client = clients()
    a, b = f"{q(queue_name)}.a", f"{q(queue_name)}.b"
    client.receipt(client.conn.subscribe, a, id="a", ack="client")
    client.receipt(client.conn.subscribe, b, id="b", ack="client")
    client.conn.send(a, "only a")
    client.conn.send(f"{a},{b}", "both")
    messages = client.messages(3)
    assert len({m.headers["ack"] for m in messages}) == 3, [m.headers for m in messages]
    (b_copy,) = [m for m in messages if m.headers["subscription"] == "b"]
    client.receipt(client.conn.ack, b_copy.headers["ack"])
    assert broker.stats(f"queue://{queue_name}.b").dequeued == 1
    stats_a = broker.stats(f"queue://{queue_name}.a")
    assert (stats_a.dequeued, stats_a.in_flight) == (0, 2)


def test_a_stomp_1_1_ack_names_the_message_id_and_the_subscription(gateway, queue_name, broker):
    """1.1 has no ack header: its ACK names message-id and subscription, so two subscriptions holding the
    same message id are told apart by the subscription."""
    raw = RawStomp(gateway.stomp_url, version="1.1")
    try:
        raw.connect(version="1.1")
        a, b = f"{q(queue_name)}.a", f"{q(queue_name)}.b"
        for key, destination in (("a", a), ("b", b)):
            raw.send("SUBSCRIBE", {"destination": destination, "id": key, "ack": "client"})
        raw.send("SEND", {"destination": f"{a},{b}"}, b"both")
        messages = [raw.expect("MESSAGE"), raw.expect("MESSAGE")]
        (b_copy,) = [m for m in messages if m.get("subscription") == "b"]
        raw.send("ACK", {"message-id": b_copy.get("message-id"), "subscription": "b", "receipt": "r"})
        raw.expect("RECEIPT")
        assert broker.stats(f"queue://{queue_name}.b").dequeued == 1
        assert broker.stats(f"queue://{queue_name}.a").in_flight == 1
    finally:
        raw.close()


# -- ack modes and prefetch -----------------------------------------------------------------------------

def test_auto_mode_acks_on_dispatch_so_the_window_never_fills(clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", headers={"activemq.prefetchSize": "1"})
    for i in range(5):
        client.conn.send(q(queue_name), f"m{i}")
    assert [m.body for m in client.messages(5)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert broker.stats(f"queue://{queue_name}").queue_size == 0


def test_client_mode_holds_the_prefetch_window_and_acks_cumulatively(clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client",
                   headers={"activemq.prefetchSize": "2"})
    for i in range(5):
        client.conn.send(q(queue_name), f"m{i}")
    first, second = client.messages(2)
    assert client.silent(0.3), "more than the prefetch window arrived"
    client.receipt(client.conn.ack, second.headers["ack"])  # acks m0 and m1
    assert [m.body for m in client.messages(2)] == [b"m2", b"m3"]
    stats = broker.stats(f"queue://{queue_name}")
    assert stats.dequeued == 2 and stats.in_flight == 2 and stats.pending == 1


def test_client_individual_acks_exactly_one_and_the_rest_is_redelivered(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual",
                   headers={"activemq.prefetchSize": "2"})
    for i in range(3):
        client.conn.send(q(queue_name), f"m{i}")
    m0, m1 = client.messages(2)
    client.receipt(client.conn.ack, m1.headers["ack"])
    (m2,) = client.messages(1)
    assert m2.body == b"m2"
    client.conn.disconnect(receipt="bye")  # m0 and m2 are unacked: they go back
    other = clients()
    other.receipt(other.conn.subscribe, q(queue_name), id="s2", ack="client-individual")
    again = other.messages(2)
    assert sorted(m.body for m in again) == [b"m0", b"m2"]
    assert all(m.headers["redelivered"] == "true" for m in again)


def test_unsubscribe_returns_unacked_messages_for_redelivery(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client")
    client.conn.send(q(queue_name), "once")
    assert "redelivered" not in client.expect("MESSAGE").headers
    client.receipt(client.conn.unsubscribe, "s")
    client.receipt(client.conn.subscribe, q(queue_name), id="s-again", ack="client")
    message = client.expect("MESSAGE")
    assert message.body == b"once" and message.headers["redelivered"] == "true"


def test_a_receipted_subscribe_gets_its_receipt_before_any_message(clients, queue_name):
    client = clients()
    for i in range(20):
        client.conn.send(q(queue_name), f"m{i}")
    client.conn.subscribe(q(queue_name), id="s", receipt="sub-1")
    assert client.next().command == "RECEIPT"
    assert len(client.messages(20)) == 20


def test_nack_dead_letters_at_once(clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual")
    client.conn.send(q(queue_name), "poison", headers={"persistent": "true"})
    message = client.expect("MESSAGE")
    client.receipt(client.conn.nack, message.headers["ack"])
    client.receipt(client.conn.subscribe, "/queue/ActiveMQ.DLQ", id="dlq",
                   headers={"selector": f"JMSMessageID = '{message.headers['message-id']}'"})
    dead = client.expect("MESSAGE")
    assert dead.body == b"poison"
    assert dead.headers["original-destination"] == q(queue_name)
    assert "redelivered" not in dead.headers
    assert broker.stats(f"queue://{queue_name}").queue_size == 0


def test_nack_inside_a_transaction_is_refused_as_activemq_does(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual")
    client.conn.send(q(queue_name), "m")
    message = client.expect("MESSAGE")
    tx = client.conn.begin()
    client.conn.nack(message.headers["ack"], transaction=tx)
    assert client.expect("ERROR").headers["message"] == "Poison ack cannot be transacted"


# -- transactions ---------------------------------------------------------------------------------------

def test_sends_in_a_transaction_arrive_on_commit_and_never_on_abort(clients, queue_name):
    consumer = clients()
    consumer.receipt(consumer.conn.subscribe, q(queue_name), id="s")
    producer = clients()
    tx = producer.conn.begin()
    producer.conn.send(q(queue_name), "a", transaction=tx)
    producer.conn.send(q(queue_name), "b", transaction=tx)
    assert consumer.silent(0.3)
    producer.receipt(producer.conn.commit, tx)
    assert [m.body for m in consumer.messages(2)] == [b"a", b"b"]
    tx2 = producer.conn.begin()
    producer.conn.send(q(queue_name), "never", transaction=tx2)
    producer.receipt(producer.conn.abort, tx2)
    assert consumer.silent(0.3)


def test_an_ack_in_an_aborted_transaction_is_undone_and_a_committed_one_consumes(clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual")
    client.conn.send(q(queue_name), "m")
    message = client.expect("MESSAGE")
    tx = client.conn.begin()
    client.conn.ack(message.headers["ack"], transaction=tx)
    client.receipt(client.conn.abort, tx)
    assert client.silent(0.3)  # as ActiveMQ: still delivered to this subscription, its ack id valid again
    tx = client.conn.begin()
    client.conn.ack(message.headers["ack"], transaction=tx)
    client.receipt(client.conn.commit, tx)
    stats = broker.stats(f"queue://{queue_name}")
    assert stats.queue_size == 0 and stats.dequeued == 1


def test_a_commit_that_cannot_apply_whole_applies_nothing_and_is_rolled_back_as_activemq_does(
        clients, queue_name, broker):
    """The queue a transaction SENT to is deleted before its COMMIT: neither the SEND nor the ACK before it
    applies; the ERROR is ActiveMQ's `COMMIT FAILED: Transaction rolled back`, its body naming the SEND; as
    in ActiveMQ the transaction is rolled back, so the ACKed message comes again, redelivered to the
    subscription, which goes on (as the connection: the ERROR is not fatal)."""
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual")
    client.conn.send(q(queue_name), "m")
    message = client.expect("MESSAGE")
    tx = client.conn.begin()
    client.conn.send(q(queue_name + "-audit"), "audit", transaction=tx)
    client.conn.ack(message.headers["ack"], transaction=tx)
    client.receipt(client.conn.send, q(queue_name + "-other"), "sync")  # (the SENDs before it are stored)
    broker.delete_destination(f"queue://{queue_name}-audit")
    client.conn.commit(tx, headers={"receipt": "r-commit"})
    # the rolled back ACK's message comes back, before or after the ERROR
    frames = sorted([client.next(), client.next()], key=lambda frame: frame.command)
    assert [frame.command for frame in frames] == ["ERROR", "MESSAGE"], frames
    error, again = frames
    assert error.headers["message"] == "COMMIT FAILED: Transaction rolled back"
    assert error.headers["receipt-id"] == "r-commit"
    body = error.body.decode() if isinstance(error.body, bytes) else error.body
    assert f"send to queue://{queue_name}-audit" in body and "nothing was applied" in body, body
    stats = broker.stats(f"queue://{queue_name}")
    assert (stats.enqueued, stats.dequeued) == (1, 0)
    assert (again.body, again.headers["redelivered"]) == (b"m", "true")


def test_commit_of_an_unknown_transaction_is_an_error(clients):
    client = clients()
    client.conn.commit("nope")
    assert client.expect("ERROR").headers["message"] == "Invalid transaction id: nope"


# -- receipts, disconnect, errors -----------------------------------------------------------------------

def test_every_frame_with_a_receipt_header_gets_its_receipt(gateway, queue_name):
    raw = RawStomp(gateway.stomp_url)
    try:
        raw.connect()
        frames = [
            ("SUBSCRIBE", {"destination": q(queue_name), "id": "s", "ack": "client"}),
            ("SEND", {"destination": q(queue_name)}),
            ("BEGIN", {"transaction": "t1"}),
            ("COMMIT", {"transaction": "t1"}),
            ("BEGIN", {"transaction": "t2"}),
            ("ABORT", {"transaction": "t2"}),
        ]
        for n, (command, headers) in enumerate(frames):
            raw.send(command, {**headers, "receipt": f"r{n}"})
            frame = raw.receive()
            while frame.command == "MESSAGE":
                message, frame = frame, raw.receive()
            assert (frame.command, frame.get("receipt-id")) == ("RECEIPT", f"r{n}")
        raw.send("ACK", {"id": message.get("ack"), "receipt": "r-ack"})
        assert raw.expect("RECEIPT").get("receipt-id") == "r-ack"
        raw.send("UNSUBSCRIBE", {"id": "s", "receipt": "r-unsub"})
        assert raw.expect("RECEIPT").get("receipt-id") == "r-unsub"
        raw.send("DISCONNECT", {"receipt": "r-bye"})
        assert raw.expect("RECEIPT").get("receipt-id") == "r-bye"
        assert raw.closed_within(3)
    finally:
        raw.close()


@pytest.mark.parametrize(("destination", "headers", "message"), [
    ("", {}, "Invalid empty or 'null' Destination header"),
    ("/remote-temp-topic/prices", {}, "Invalid destination"),  # not a temporary destination's name
    ("/topic/q,/queue/q", {"activemq.subscriptionName": "durable"},
     "Invalid Subscription: cannot durably subscribe to a Queue destination!"),
    ("/queue/q", {"activemq.subscriptionName": "durable"},
     "Invalid Subscription: cannot durably subscribe to a Queue destination!"),
    ("/queue/q", {"ack": "sometimes"}, "Invalid ack mode"),
    ("/queue/q", {"activemq.prefetchSize": "lots"}, "Invalid activemq.prefetchSize header"),
    ("/queue/q", {"selector": "price >"}, None),
])
def test_bad_subscriptions_get_an_error_frame_with_the_receipt_id_and_the_connection_goes_on(
        clients, queue_name, destination, headers, message):
    client = clients()
    headers = dict(headers)  # the parameters are shared by the ws and tcp runs
    ack = headers.pop("ack", "auto")  # stomp.py writes its own ack header
    client.conn.subscribe(destination, id="s", ack=ack, receipt="r-bad", headers=headers)
    error = client.expect("ERROR")
    assert error.headers["receipt-id"] == "r-bad"
    if message is not None:
        assert error.headers["message"] == message
    else:
        assert "position" in error.body.decode()
    assert error.body  # the body explains
    client.receipt(client.conn.subscribe, q(queue_name), id="s")  # (the refused one took nothing)


def test_a_bad_send_among_batched_ones_is_refused_alone_and_names_itself(gateway, queue_name, broker):
    from gateway.stomp.frames import encode

    raw = RawStomp(gateway.stomp_url)
    try:
        raw.connect()
        dest = ("destination", q(queue_name))
        frames = [encode("SEND", [dest, ("receipt", "r1")], b"one"),
                  encode("SEND", [dest, ("priority", "high"), ("receipt", "r2")], b"bad"),
                  encode("SEND", [dest, ("receipt", "r3")], b"three")]
        raw.send_raw(b"".join(frames))  # one WebSocket message: the gateway batches them
        assert raw.expect("RECEIPT").get("receipt-id") == "r1"
        error = raw.expect("ERROR")
        assert error.get("receipt-id") == "r2" and error.get("message") == "Invalid priority header"
        assert raw.expect("RECEIPT").get("receipt-id") == "r3"
    finally:
        raw.close()
    assert broker.stats(f"queue://{queue_name}").enqueued == 2


def test_an_ack_for_an_unknown_message_is_unexpected(clients):
    client = clients()
    client.conn.ack("ID:nothing")
    assert client.expect("ERROR").headers["message"] == "Unexpected ACK received for message-id [ID:nothing]"


def test_a_nack_for_an_unknown_message_is_unexpected_by_its_own_name(clients):
    """ActiveMQ's ProtocolConverter.onStompNack: "Unexpected NACK received for message-id [...]"."""
    client = clients()
    client.conn.nack("ID:nothing")
    assert client.expect("ERROR").headers["message"] == "Unexpected NACK received for message-id [ID:nothing]"


def test_an_unknown_command_is_an_error(gateway):
    raw = RawStomp(gateway.stomp_url)
    try:
        raw.connect()
        raw.send_raw(b"FROB\n\n\x00")
        assert raw.expect("ERROR").get("message") == "Unknown STOMP action: FROB"
        assert raw.closed_within(3)
    finally:
        raw.close()


def test_permissions_are_the_rest_apis(clients):
    bob = clients("bob", "secret")
    bob.receipt(bob.conn.subscribe, "/queue/bob.inbox", id="mine")
    bob.conn.send("/queue/bob.inbox", "to myself")
    assert bob.expect("MESSAGE").body == b"to myself"
    bob.conn.subscribe("/queue/alice.inbox", id="theirs")
    assert bob.expect("ERROR").headers["message"] == "User bob is not authorized to read from: queue://alice.inbox"
    bob2 = clients("bob", "secret")
    bob2.conn.send("/queue/alice.inbox", "x")
    assert bob2.expect("ERROR").headers["message"] == "User bob is not authorized to write to: queue://alice.inbox"


# -- heart-beats ----------------------------------------------------------------------------------------

def test_heart_beats_flow_both_ways_and_keep_the_connection(clients, queue_name):
    client = clients(heartbeats=(200, 200))
    time.sleep(0.8)
    assert client.listener.heart_beats >= 2
    client.receipt(client.conn.subscribe, q(queue_name), id="s")
    client.conn.send(q(queue_name), "still here")
    assert client.expect("MESSAGE").body == b"still here"


def test_a_client_that_promises_heart_beats_and_goes_silent_is_disconnected(gateway):
    raw = RawStomp(gateway.stomp_url)
    try:
        connected = raw.connect(heart_beat="200,0")
        assert connected.get("heart-beat") == "0,200"
        start = time.monotonic()
        error = raw.expect("ERROR", timeout=3)
        assert error.get("message", "").startswith("Channel was inactive for too")
        assert 0.25 <= time.monotonic() - start <= 3  # 1.5 x 200 ms, with room for a loaded machine
        assert raw.closed_within(3)
    finally:
        raw.close()


def test_a_stomp_1_0_client_that_asks_for_heart_beats_gets_them_as_from_activemq(gateway):
    """ActiveMQ negotiates `heart-beat` whatever the version, 1.0 included: both ways here."""
    raw = RawStomp(gateway.stomp_url, version="1.0")
    try:
        connected = raw.connect(version=None, heart_beat="200,200")
        assert (connected.get("version"), connected.get("heart-beat")) == ("1.0", "200,200")
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            raw.send_raw(b"\n")
            with contextlib.suppress(TimeoutError):
                raw.receive(timeout=0.1)
        assert raw.heart_beats >= 2
        silent = RawStomp(gateway.stomp_url, version="1.0")
        try:
            silent.connect(version=None, heart_beat="200,0")
            error = silent.expect("ERROR", timeout=3)
            assert error.get("message", "").startswith("Channel was inactive for too")
        finally:
            silent.close()
    finally:
        raw.close()


# -- dispatch: groups, exclusive, priority, selectors, noLocal ------------------------------------------

def test_message_groups_stick_to_one_of_two_subscribers(clients, queue_name):
    a, b = clients(), clients()
    for client in (a, b):
        client.receipt(client.conn.subscribe, q(queue_name), id="s", ack="client-individual",
                       headers={"signalbox.groupHeaders": "true"})
    producer = clients()
    for i in range(4):
        for group in ("g1", "g2"):
            producer.conn.send(q(queue_name), f"{group}-{i}", headers={"JMSXGroupID": group})
    got: dict[str, list[str]] = {"a": [], "b": []}
    deadline = time.monotonic() + 5
    while len(got["a"]) + len(got["b"]) < 8 and time.monotonic() < deadline:
        for name, client in (("a", a), ("b", b)):
            while not client.listener.frames.empty():
                got[name].append(client.expect("MESSAGE").headers["JMSXGroupID"])
        time.sleep(0.01)
    assert sorted(got["a"] + got["b"]) == ["g1"] * 4 + ["g2"] * 4
    assert len(set(got["a"])) == 1 and len(set(got["b"])) == 1 and set(got["a"]) != set(got["b"])


def test_the_first_exclusive_subscriber_gets_everything_until_it_leaves(clients, queue_name):
    first, second = clients(), clients()
    for client in (first, second):
        client.receipt(client.conn.subscribe, q(queue_name), id="s", headers={"activemq.exclusive": "true"})
    producer = clients()
    for i in range(3):
        producer.conn.send(q(queue_name), f"m{i}")
    assert len(first.messages(3)) == 3
    assert second.silent(0.3)
    first.conn.disconnect(receipt="bye")
    producer.conn.send(q(queue_name), "after")
    assert second.expect("MESSAGE").body == b"after"


def test_the_higher_priority_subscriber_fills_its_window_first(clients, queue_name):
    low, high = clients(), clients()
    low.receipt(low.conn.subscribe, q(queue_name), id="s", ack="client",
                headers={"activemq.prefetchSize": "2"})
    high.receipt(high.conn.subscribe, q(queue_name), id="s", ack="client",
                 headers={"activemq.prefetchSize": "2", "activemq.priority": "5"})
    producer = clients()
    for i in range(3):
        producer.conn.send(q(queue_name), f"m{i}")
    assert [m.body for m in high.messages(2)] == [b"m0", b"m1"]
    assert [m.body for m in low.messages(1)] == [b"m2"]


def test_selectors_use_stomps_string_coercion(clients, queue_name, broker):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", headers={"selector": "price > 10"})
    client.conn.send(q(queue_name), "cheap", headers={"price": "5"})
    client.conn.send(q(queue_name), "dear", headers={"price": "20"})
    assert client.expect("MESSAGE").body == b"dear"
    assert client.silent(0.3)
    assert broker.stats(f"queue://{queue_name}").pending == 1


def test_no_local_subscribers_skip_their_own_connections_messages(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, q(queue_name), id="s", headers={"activemq.noLocal": "true"})
    client.conn.send(q(queue_name), "mine")
    assert client.silent(0.3)
    other = clients()
    other.conn.send(q(queue_name), "theirs")
    assert client.expect("MESSAGE").body == b"theirs"


# -- STOMP 1.0 and 1.1 ----------------------------------------------------------------------------------

def test_stomp_1_1_escapes_headers_and_acks_by_message_id_and_subscription(gateway, queue_name):
    raw = RawStomp(gateway.stomp_url, version="1.1")
    try:
        assert raw.connect(version="1.1").get("version") == "1.1"
        raw.send("SUBSCRIBE", {"destination": q(queue_name), "id": "s", "ack": "client", "receipt": "r"})
        raw.expect("RECEIPT")
        raw.send("SEND", {"destination": q(queue_name), "a:b": "line1\nline2\\"})
        message = raw.expect("MESSAGE")
        assert message.get("a:b") == "line1\nline2\\"
        assert "ack" not in message  # the ack header is STOMP 1.2's
        raw.send("ACK", {"message-id": message.get("message-id"), "subscription": "s", "receipt": "r-ack"})
        assert raw.expect("RECEIPT").get("receipt-id") == "r-ack"
    finally:
        raw.close()


def test_stomp_1_0_subscribes_without_an_id_and_unsubscribes_by_destination(gateway, queue_name):
    raw = RawStomp(gateway.stomp_url, version="1.0")
    try:
        connected = raw.connect(version=None)
        assert (connected.get("version"), connected.get("heart-beat")) == ("1.0", "0,0")  # as ActiveMQ's
        raw.send("SUBSCRIBE", {"destination": q(queue_name), "receipt": "r"})
        raw.expect("RECEIPT")
        raw.send("SEND", {"destination": q(queue_name)}, b"old school")
        message = raw.expect("MESSAGE")
        assert message.body == b"old school" and "subscription" not in message
        raw.send("UNSUBSCRIBE", {"destination": q(queue_name), "receipt": "r2"})
        assert raw.expect("RECEIPT").get("receipt-id") == "r2"
    finally:
        raw.close()


@pytest.mark.parametrize("temporary", [False, True])
def test_stomp_1_0_unsubscribes_by_destination_a_subscription_made_with_an_id(gateway, queue_name, temporary):
    """As ActiveMQ's onStompUnsubscribe, a 1.0 UNSUBSCRIBE's destination matches a subscription made with
    an id too (differential 27_versions_odd_frames), a temporary queue's included."""
    destination = "/temp-queue/replies" if temporary else q(queue_name)
    raw = RawStomp(gateway.stomp_url, version="1.0")
    try:
        raw.connect(version=None)
        raw.send("UNSUBSCRIBE", {"destination": "/temp-queue/never", "receipt": "r0"})
        assert raw.expect("ERROR").get("message") == "No subscription matched."
        raw.send("SUBSCRIBE", {"destination": destination, "id": "s", "receipt": "r"})
        raw.expect("RECEIPT")
        raw.send("UNSUBSCRIBE", {"destination": destination, "receipt": "r2"})
        assert raw.expect("RECEIPT").get("receipt-id") == "r2"
        raw.send("SEND", {"destination": destination, "receipt": "r3"}, b"for nobody")
        raw.expect("RECEIPT")
        with pytest.raises(TimeoutError):  # no subscription left to deliver it
            raw.receive(timeout=0.5)
    finally:
        raw.close()
