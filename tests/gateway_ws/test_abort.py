"""A slow-consumer strategy (run by the real Celery worker) or an operator aborts a WebSocket subscriber:
the client is told why (spec §8.4). abortConnection=false ends only that subscription and the connection
stays open; abortConnection=true sends the reason and closes the connection. Either way the unacked
messages go to other consumers, marked redelivered."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from broker_core.broker import Broker
from broker_core.destinations import parse_destination
from broker_core.model import ConsumerRef
from signalbox import tasks
from tests.helpers.gateway_server import running_gateway
from tests.helpers.stomp_client import Client

LEASE_MS = 1500  # the link notices a closed consumer within a third of this


@pytest.fixture(scope="module")
def fast_gateway(gateway_data):
    with running_gateway(*gateway_data, "abort", SIGNALBOX_WS_LEASE_MS=str(LEASE_MS)) as server:
        yield server


@pytest.fixture
def broker(fast_gateway, redis_client) -> Broker:
    return Broker(redis_client, fast_gateway.namespace)


@pytest.fixture
def queue(broker) -> str:
    """A queue of its own whose policy aborts a consumer at the first check after 200 ms without an ack."""
    name = f"abort.{uuid.uuid4().hex[:10]}"
    broker.policies.set_entry("queue", name, {
        "slowConsumerStrategy": "abortSlowAckConsumer", "checkPeriod": 100, "maxSlowDuration": 100,
        "maxTimeSinceLastAck": 200})
    return name


def run_slow_check_until_aborted(namespace: str, queue: str, timeout: float = 10) -> list[str]:
    """The strategy, run by the session's Celery worker, until it aborts someone; the aborted ids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = tasks.check_slow_consumers.delay(queue, namespace=namespace).get(timeout=10)
        if result["aborted"]:
            return result["aborted"]
        time.sleep(0.1)
    raise AssertionError("the strategy aborted nobody")


def operator_abort(broker: Broker, queue: str, reason: str, abort_connection: bool) -> str:
    """Abort the queue's only consumer through the worker's task, as an operator would."""
    (consumer,) = broker.stats(queue).consumers
    tasks.abort_consumer.delay(queue, consumer.consumer_id, reason, abort_connection,
                               namespace=broker.namespace).get(timeout=10)
    return consumer.consumer_id


def test_slow_ack_strategy_aborts_a_stomp_subscription_with_a_notice_and_the_connection_stays_open(
        fast_gateway, broker, queue, celery_worker):
    slow = Client(fast_gateway.port).connect()
    other = Client(fast_gateway.port).connect()
    try:
        slow.receipt(slow.conn.subscribe, f"/queue/{queue}", id="s1", ack="client-individual",
                     headers={"activemq.prefetchSize": "10"})
        for i in range(3):
            other.conn.send(f"/queue/{queue}", f"m{i}", headers={"persistent": "true"})
        held = slow.messages(3)
        time.sleep(0.3)  # longer than maxTimeSinceLastAck without an ack

        aborted = run_slow_check_until_aborted(fast_gateway.namespace, queue)

        notice = slow.expect("ERROR", timeout=LEASE_MS / 1000 + 3)
        assert notice.headers["message"].startswith("aborted by abortSlowAckConsumerStrategy: no "
                                                    "acknowledgement for ")
        assert notice.headers["subscription"] == "s1"
        assert notice.headers["destination"] == f"/queue/{queue}"
        assert notice.headers["abort-strategy"] == "abortSlowAckConsumer"
        assert notice.headers["abort-connection"] == "false"
        assert b"SUBSCRIBE again" in notice.body
        assert broker.stats(queue).consumers == []
        assert len(aborted) == 1

        # the connection is still open: a late ACK of an aborted message is let pass, SEND works, and the
        # messages come back redelivered to a new subscription
        slow.receipt(slow.conn.ack, held[0].headers["ack"])
        slow.receipt(slow.conn.send, f"/queue/{queue}", "m3")
        other.receipt(other.conn.subscribe, f"/queue/{queue}", id="s2", ack="client-individual")
        again = other.messages(4)
        assert [m.body for m in again] == [b"m0", b"m1", b"m2", b"m3"]
        assert [m.headers.get("redelivered") for m in again] == ["true", "true", "true", None]
        assert slow.conn.is_connected()
    finally:
        slow.close()
        other.close()


def test_abort_with_abortConnection_sends_the_reason_in_an_ERROR_and_closes_the_stomp_connection(
        fast_gateway, broker, queue, celery_worker):
    slow = Client(fast_gateway.port).connect()
    try:
        slow.receipt(slow.conn.subscribe, f"/queue/{queue}", id="s1", ack="client")
        slow.receipt(slow.conn.subscribe, f"/queue/{queue}.other", id="s2", ack="client")
        slow.receipt(slow.conn.send, f"/queue/{queue}", "m0")
        slow.expect("MESSAGE")

        operator_abort(broker, queue, "stuck for an hour", abort_connection=True)

        error = slow.expect("ERROR", timeout=LEASE_MS / 1000 + 3)
        assert error.headers["message"] == "stuck for an hour"
        assert error.headers["abort-strategy"] == "operator"
        assert error.headers["abort-connection"] == "true"
        assert slow.expect("DISCONNECTED").command == "DISCONNECTED"
        # the whole connection went: its other subscription too; the message is back in the queue
        assert broker.stats(f"{queue}.other").consumers == []
        assert broker.stats(queue).queue_size == 1
    finally:
        slow.close()


def _json(ws, timeout: float = 5) -> dict:
    return json.loads(ws.recv(timeout))


def test_json_subscriber_gets_a_typed_subscription_aborted_event_and_stays_connected(fast_gateway, broker,
                                                                                     queue, celery_worker):
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{fast_gateway.port}/ws/v1") as ws:
        ws.send(json.dumps({"type": "connect", "login": "alice", "passcode": "secret", "id": 1}))
        assert _json(ws)["type"] == "ok"
        ws.send(json.dumps({"type": "subscribe", "subscription": "s1", "destination": queue, "id": 2}))
        assert _json(ws)["type"] == "ok"
        ws.send(json.dumps({"type": "send", "destination": queue, "message": {"body": "m0"}, "id": 3}))
        answers = [_json(ws), _json(ws)]
        delivered = next(a for a in answers if a["type"] == "message")
        time.sleep(0.3)

        run_slow_check_until_aborted(fast_gateway.namespace, queue)

        event = _json(ws, LEASE_MS / 1000 + 3)
        assert event["type"] == "subscription_aborted"
        assert event["subscription"] == "s1"
        assert event["destination"] == f"queue://{queue}"
        assert event["strategy"] == "abortSlowAckConsumer"
        assert event["abort_connection"] is False
        assert event["reason"].startswith("aborted by abortSlowAckConsumerStrategy")
        # still connected: an ack on the aborted subscription is a request error, and a new subscription
        # gets the message again
        ws.send(json.dumps({"type": "ack", "subscription": "s1",
                            "message_id": delivered["message"]["message_id"], "id": 4}))
        error = _json(ws)
        assert (error["type"], error["code"], error["id"]) == ("error", "unknown_subscription", 4)
        ws.send(json.dumps({"type": "subscribe", "subscription": "s2", "destination": queue, "id": 5}))
        assert _json(ws)["type"] == "ok"
        again = _json(ws)
        assert again["type"] == "message" and again["message"]["redelivered"] is True


def test_json_abortConnection_ends_with_a_consumer_aborted_error_and_a_close(fast_gateway, broker, queue,
                                                                             celery_worker):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{fast_gateway.port}/ws/v1") as ws:
        ws.send(json.dumps({"type": "connect", "login": "alice", "passcode": "secret", "id": 1}))
        assert _json(ws)["type"] == "ok"
        ws.send(json.dumps({"type": "subscribe", "subscription": "s1", "destination": queue, "id": 2}))
        assert _json(ws)["type"] == "ok"

        operator_abort(broker, queue, "too slow", abort_connection=True)

        event = _json(ws, LEASE_MS / 1000 + 3)
        assert (event["type"], event["abort_connection"], event["reason"]) == (
            "subscription_aborted", True, "too slow")
        assert _json(ws) == {"type": "error", "code": "consumer_aborted", "message": "too slow"}
        with pytest.raises(ConnectionClosed):
            ws.recv(5)


def test_lease_lapse_without_an_abort_still_ends_the_connection(fast_gateway, broker, queue):
    """A consumer closed under the connection without a tombstone (its lease lapsed) is not an abort:
    the connection cannot keep its promises and ends, as before."""
    client = Client(fast_gateway.port).connect()
    try:
        client.receipt(client.conn.subscribe, f"/queue/{queue}", id="s1", ack="client")
        (consumer,) = broker.stats(queue).consumers
        broker.close_consumer(ConsumerRef(parse_destination(queue), consumer.consumer_id), "lease lapsed")
        error = client.expect("ERROR", timeout=LEASE_MS / 1000 + 3)
        assert error.headers["message"] == "Connection lost its subscriptions"
        assert client.expect("DISCONNECTED")
    finally:
        client.close()


@pytest.fixture(scope="module")
def slow_lease_gateway(gateway_data):
    with running_gateway(*gateway_data, "abort-long-lease", SIGNALBOX_WS_LEASE_MS="60000") as server:
        yield server


def test_the_abort_wakes_the_gateway_so_the_notice_comes_at_once_not_at_the_next_lease_renewal(
        slow_lease_gateway, redis_client, queue, celery_worker):
    """The lease here is 60 s (renewed every 20 s); the notice must not wait for that."""
    broker = Broker(redis_client, slow_lease_gateway.namespace)
    client = Client(slow_lease_gateway.port).connect()
    try:
        client.receipt(client.conn.subscribe, f"/queue/{queue}", id="s1", ack="client")
        started = time.monotonic()
        operator_abort(broker, queue, "wake up", abort_connection=False)
        notice = client.expect("ERROR", timeout=5)
        assert notice.headers["message"] == "wake up"
        assert time.monotonic() - started < 5
        assert client.conn.is_connected()
    finally:
        client.close()


def ack_in_a_transaction_then_abort(client: Client, other: Client, broker, queue: str, ack: str) -> None:
    """Two messages sent by `other`; `client` subscribes in ack mode `ack`, gets both, ACKs the first in
    transaction `t`; an operator then aborts its subscription ("stuck")."""
    from broker_core import maintenance

    for body in ("m0", "m1"):
        other.receipt(other.conn.send, f"/queue/{queue}", body)
    client.conn.subscribe(f"/queue/{queue}", id="s1", ack=ack, headers={"activemq.prefetchSize": "10"})
    m0, _m1 = client.messages(2)
    client.receipt(client.conn.begin, "t")
    client.receipt(client.conn.ack, m0.headers["ack"], transaction="t")
    (consumer,) = broker.stats(queue).consumers
    maintenance.abort_consumer(broker, ConsumerRef(parse_destination(queue), consumer.consumer_id), "stuck")
    assert client.expect("ERROR", timeout=LEASE_MS / 1000 + 3).headers["message"] == "stuck"


@pytest.mark.parametrize("end", ["COMMIT", "ABORT"])
def test_an_aborted_subscription_leaves_its_transacted_acks_to_the_transaction(fast_gateway, broker, queue,
                                                                                end):
    """A client-individual ACK in an open transaction, then an operator aborts the subscription: as after
    an UNSUBSCRIBE, the acknowledged message is held for the transaction (dispatched to nobody), not
    returned with the subscription's other messages; the COMMIT consumes it, an ABORT returns it,
    redelivered. It went back to the queue with the abort, and the COMMIT acknowledged nothing."""
    client = Client(fast_gateway.port).connect()
    other = Client(fast_gateway.port).connect()
    try:
        ack_in_a_transaction_then_abort(client, other, broker, queue, "client-individual")
        other.receipt(other.conn.subscribe, f"/queue/{queue}", id="s2", ack="client-individual")
        (again,) = other.messages(1)
        assert (again.body, again.headers.get("redelivered")) == (b"m1", "true")
        assert other.silent(0.3)  # m0 is the transaction's
        client.receipt(client.conn.commit if end == "COMMIT" else client.conn.abort, "t")
        if end == "COMMIT":
            assert other.silent(0.3)
            assert broker.stats(queue).dequeued == 1
        else:
            (back,) = other.messages(1)
            assert (back.body, back.headers.get("redelivered")) == (b"m0", "true")
    finally:
        client.close()
        other.close()


def test_an_aborted_client_subscription_returns_what_its_transaction_acked_and_the_commit_succeeds(
        fast_gateway, broker, queue):
    """`client` mode, as ActiveMQ's STOMP (its cumulative ACK goes to the broker at the COMMIT, for the
    subscriptions still open): the ACKed messages go back with the aborted subscription, redelivered,
    and the COMMIT succeeds without acknowledging them."""
    client = Client(fast_gateway.port).connect()
    other = Client(fast_gateway.port).connect()
    try:
        ack_in_a_transaction_then_abort(client, other, broker, queue, "client")
        client.receipt(client.conn.commit, "t")
        other.receipt(other.conn.subscribe, f"/queue/{queue}", id="s2", ack="client-individual")
        again = other.messages(2)
        assert [(m.body, m.headers.get("redelivered")) for m in again] == [(b"m0", "true"), (b"m1", "true")]
        assert broker.stats(queue).dequeued == 0
    finally:
        client.close()
        other.close()
