"""The JSON protocol at /ws/v1 (in-process over the project's ASGI stack, real Redis): connect, subscribe,
send, ack, nack, transactions, the REST API's message shapes, errors as typed messages."""

from __future__ import annotations

import asyncio

import pytest
from django.test import override_settings

from gateway import runtime
from tests.helpers.channels import receive_json, send_json, websocket

pytestmark = pytest.mark.usefixtures("ws_runtime", "stomp_user")


async def request(ws, **fields):
    await send_json(ws, fields)
    return await receive_json(ws)


async def answer_and_messages(ws, n_messages: int, **fields):
    """Send a request; return its answer and the next n pushed messages (they may come in either order)."""
    await send_json(ws, fields)
    answer, messages = None, []
    while answer is None or len(messages) < n_messages:
        obj = await receive_json(ws)
        if obj["type"] == "message":
            messages.append(obj)
        else:
            answer = obj
    return answer, messages


async def connected(ws, login="alice", passcode="secret"):
    answer = await request(ws, type="connect", id="c", login=login, passcode=passcode)
    assert answer["type"] == "ok" and answer["user"] == login, answer
    return answer


async def test_connect_then_subscribe_send_and_receive_the_rest_apis_delivery_shape():
    async with websocket("/ws/v1") as ws:
        answer = await connected(ws)
        assert answer["connection"].startswith("ws-")
        ok = await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.a",
                           ack_mode="auto", prefetch=10)
        assert ok == {"type": "ok", "id": 1, "subscription": "s", "prefetch": 10}
        sent, (pushed,) = await answer_and_messages(
            ws, 1, type="send", id=2, destination="json.a",
            message={"body": "hello", "priority": 6, "properties": {"n": 5}})
        assert sent["type"] == "ok" and len(sent["message_ids"]) == 1
        assert pushed["type"] == "message" and pushed["subscription"] == "s"
        message = pushed["message"]
        assert message["body"] == "hello" and message["priority"] == 6 and message["properties"] == {"n": 5}
        assert message["message_id"] == sent["message_ids"][0]
        assert message["redelivered"] is False and message["delivery_count"] == 1


async def test_client_individual_is_the_default_and_acks_one_message():
    aio = runtime.async_broker()
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.b")
        _, pushed = await answer_and_messages(ws, 2, type="send", id=2, destination="queue://json.b",
                                              messages=[{"body": "one"}, {"body": "two"}])
        first, second = (m["message"] for m in pushed)
        answer = await request(ws, type="ack", id=3, subscription="s", message_id=second["message_id"])
        assert answer == {"type": "ok", "id": 3, "acknowledged": 1}
        stats = await aio.stats("queue://json.b")
        assert stats.in_flight == 1 and stats.dequeued == 1
        assert first["body"] == "one"


async def test_nack_dead_letters():
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.c")
        _, (pushed,) = await answer_and_messages(ws, 1, type="send", id=2, destination="queue://json.c",
                                                 message={"body": "bad"})
        message = pushed["message"]
        answer = await request(ws, type="nack", id=3, subscription="s", message_id=message["message_id"])
        assert answer == {"type": "ok", "id": 3, "dead_lettered": 1}
        stats = await runtime.async_broker().stats("queue://json.c")
        assert stats.queue_size == 0


async def test_transactions_cover_sends():
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.d",
                      ack_mode="auto")
        await request(ws, type="begin", id=2, transaction="t")
        await request(ws, type="send", id=3, destination="queue://json.d", transaction="t",
                      message={"body": "later"})
        assert await ws.receive_nothing(0.2)
        answer, (pushed,) = await answer_and_messages(ws, 1, type="commit", id=4, transaction="t")
        assert answer == {"type": "ok", "id": 4}
        assert pushed["message"]["body"] == "later"


async def test_a_commit_that_cannot_apply_whole_applies_nothing_and_is_rolled_back():
    """The queue the transaction sent to is deleted before its commit: nothing applies, the error names the
    send, the transaction is rolled back (its ACKed message comes again, redelivered) and the connection
    stays."""
    aio = runtime.async_broker()
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.f")
        _, (pushed,) = await answer_and_messages(ws, 1, type="send", id=2, destination="queue://json.f",
                                                 message={"body": "m"})
        await request(ws, type="begin", id=3, transaction="t")
        await request(ws, type="send", id=4, destination="queue://json.f-audit", transaction="t",
                      message={"body": "audit"})
        await request(ws, type="ack", id=5, subscription="s", transaction="t",
                      message_id=pushed["message"]["message_id"])
        await aio.delete_destination("queue://json.f-audit")
        error, (again,) = await answer_and_messages(ws, 1, type="commit", id=6, transaction="t")
        assert error["type"] == "error" and error["code"] == "transaction_error", error
        assert "send to queue://json.f-audit" in error["message"], error
        assert "nothing was applied" in error["message"] and "rolled back" in error["message"], error
        assert again["message"]["body"] == "m" and again["message"]["redelivered"] is True
        stats = await aio.stats("queue://json.f")
        assert (stats.enqueued, stats.dequeued) == (1, 0)
        assert (await request(ws, type="begin", id=7, transaction="t"))["type"] == "ok"  # the name is free


@override_settings(SIGNALBOX_MAX_TRANSACTION_DESTINATIONS=2)
async def test_a_send_past_a_transactions_limit_is_refused_whole_and_the_transaction_stays():
    """The limits are broker_core's (TransactionLimits), so the JSON protocol has them as STOMP has: a send
    past one is an error naming its setting, nothing of it is added (no part of a composite), and the
    transaction stays open as it was, to go on or commit."""
    aio = runtime.async_broker()
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="begin", id=1, transaction="t")
        assert (await request(ws, type="send", id=2, destination="queue://json.l1", transaction="t",
                              message={"body": "one"}))["type"] == "ok"
        error = await request(ws, type="send", id=3, destination="queue://json.l2,queue://json.l3",
                              transaction="t", message={"body": "two"})
        assert error["type"] == "error" and error["code"] == "transaction_too_large", error
        assert "the limit is 2 (SIGNALBOX_MAX_TRANSACTION_DESTINATIONS)" in error["message"], error
        assert (await request(ws, type="send", id=4, destination="queue://json.l2", transaction="t",
                              message={"body": "three"}))["type"] == "ok"
        assert (await request(ws, type="commit", id=5, transaction="t")) == {"type": "ok", "id": 5}
    assert [(await aio.stats(f"queue://json.l{n}")).enqueued for n in (1, 2)] == [1, 1]


@override_settings(SIGNALBOX_MAX_TRANSACTION_SIZE=3)
async def test_a_transactions_acks_count_with_its_sends():
    """A transaction's ACKs go into the broker's transaction only at its commit, yet count from the ACK
    on: two ACKed and one sent fill a transaction of 3, and one more send is refused."""
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.c")
        _, pushed = await answer_and_messages(ws, 2, type="send", id=2, destination="queue://json.c",
                                              messages=[{"body": "a"}, {"body": "b"}])
        await request(ws, type="begin", id=3, transaction="t")
        assert (await request(ws, type="ack", id=4, subscription="s", transaction="t",
                              message_ids=[p["message"]["message_id"] for p in pushed]))["type"] == "ok"
        assert (await request(ws, type="send", id=5, destination="queue://json.c-audit", transaction="t",
                              message={"body": "x"}))["type"] == "ok"
        error = await request(ws, type="send", id=6, destination="queue://json.c-audit", transaction="t",
                              message={"body": "y"})
        assert error["code"] == "transaction_too_large", error
        assert "would hold 4 messages sent and acknowledged; the limit is 3" in error["message"], error
        assert (await request(ws, type="commit", id=7, transaction="t")) == {"type": "ok", "id": 7}


async def test_binary_bodies_travel_as_base64():
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.e",
                      ack_mode="auto")
        _, (pushed,) = await answer_and_messages(ws, 1, type="send", id=2, destination="queue://json.e",
                                                 message={"body_base64": "AAH/"})
        message = pushed["message"]
        assert message["body"] is None and message["body_base64"] == "AAH/"


@pytest.mark.parametrize(("fields", "code"), [
    ({"type": "frob"}, "unknown_type"),
    ({"type": "subscribe", "subscription": "s", "destination": "queue://x", "subscription_name": "d",
      "client_id": "c"}, "invalid_consumer"),
    ({"type": "subscribe", "subscription": "s", "destination": "topic://t", "subscription_name": "d"},
     "invalid_consumer"),
    ({"type": "unsubscribe", "subscription_name": "nope", "client_id": "c"}, "unknown_subscription"),
    ({"type": "subscribe", "subscription": "s", "destination": "queue://x", "selector": "a >"},
     "invalid_selector"),
    ({"type": "subscribe", "subscription": "s", "destination": "queue://x", "prefetch": 0},
     "invalid_consumer"),
    ({"type": "send", "destination": "queue://x", "message": {"priority": 12}}, "invalid_message"),
    ({"type": "ack", "subscription": "nope", "message_id": "ID:x"}, "unknown_subscription"),
    ({"type": "commit", "transaction": "nope"}, "transaction_error"),
])
async def test_request_errors_are_typed_messages_and_the_connection_stays(fields, code):
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        error = await request(ws, id="r", **fields)
        assert error["type"] == "error" and error["code"] == code and error["id"] == "r", error
        assert error["message"]
        ok = await request(ws, type="send", id="after", destination="queue://json.ok", message={"body": "x"})
        assert ok["type"] == "ok"


async def test_invalid_json_is_an_error_message():
    async with websocket("/ws/v1") as ws:
        await ws.send_to(text_data="{not json")
        error = await receive_json(ws)
        assert error["type"] == "error" and error["code"] == "invalid_json"


async def test_requests_before_connect_are_refused_and_a_bad_login_closes():
    async with websocket("/ws/v1") as ws:
        error = await request(ws, type="send", id=1, destination="queue://x", message={"body": "x"})
        assert error["code"] == "not_connected"
        error = await request(ws, type="connect", id=2, login="alice", passcode="nope")
        assert error["code"] == "authentication_failed"
        assert (await ws.receive_output(3))["type"] == "websocket.close"


async def test_an_api_token_connects(stomp_user):
    _, token = stomp_user
    async with websocket("/ws/v1") as ws:
        answer = await request(ws, type="connect", id=1, token=token)
        assert answer["type"] == "ok" and answer["user"] == "alice"


async def test_unsubscribe_returns_unacked_messages():
    aio = runtime.async_broker()
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.f")
        await answer_and_messages(ws, 1, type="send", id=2, destination="queue://json.f",
                                  message={"body": "x"})
        assert await request(ws, type="unsubscribe", id=3, subscription="s") == {"type": "ok", "id": 3}
        await asyncio.sleep(0)
        stats = await aio.stats("queue://json.f")
        assert stats.pending == 1 and stats.consumer_count == 0


async def two_delivered(ws, queue: str, ack_mode: str) -> tuple[str, str]:
    """Subscription "s" on `queue` in `ack_mode`, and the ids of the two messages sent and pushed to it."""
    await connected(ws)
    await request(ws, type="subscribe", id=1, subscription="s", destination=queue, ack_mode=ack_mode)
    _, pushed = await answer_and_messages(ws, 2, type="send", id=2, destination=queue,
                                          messages=[{"body": "one"}, {"body": "two"}])
    first, second = (m["message"]["message_id"] for m in pushed)
    return first, second


@pytest.mark.parametrize(("kind", "ack_mode"), [("ack", "client-individual"), ("ack", "client"),
                                                ("nack", "client-individual")])
async def test_an_ack_or_nack_naming_one_unknown_id_changes_nothing(kind, ack_mode):
    """A list with one id the subscription does not hold (or the same id twice) is refused whole, as the
    REST API's ack and nack are: none of the others is acknowledged or dead-lettered."""
    aio = runtime.async_broker()
    queue = f"queue://json.partial.{kind}.{ack_mode}"
    async with websocket("/ws/v1") as ws:
        first, second = await two_delivered(ws, queue, ack_mode)
        for ids in ([first, "ID:not-delivered"], [second, second]):
            error = await request(ws, type=kind, id=3, subscription="s", message_ids=ids)
            assert error["type"] == "error" and error["code"] == "not_in_flight", error
            stats = await aio.stats(queue)
            assert (stats.in_flight, stats.dequeued, stats.deadlettered) == (2, 0, 0), ids
        # the ids are still held: a correct request afterwards goes through
        answer = await request(ws, type=kind, id=4, subscription="s", message_ids=[second, first])
        assert answer["type"] == "ok", answer
        stats = await aio.stats(queue)
        assert stats.in_flight == 0 and stats.dequeued == 2


@pytest.mark.parametrize("ack_mode", ["client-individual", "client"])
async def test_a_list_ack_is_one_broker_call_acknowledged_whole_or_not_at_all(ack_mode):
    """The link holds both ids, but the broker no longer has the second in flight (an operator removed
    it): the list's one ack call is refused by the broker whole, so the first stays unacknowledged
    rather than being acknowledged before the refusal (as when each id had its own call)."""
    aio = runtime.async_broker()
    queue = f"queue://json.whole.{ack_mode}"
    async with websocket("/ws/v1") as ws:
        first, second = await two_delivered(ws, queue, ack_mode)
        assert await aio.remove_message(queue, second)
        error = await request(ws, type="ack", id=3, subscription="s", message_ids=[first, second])
        assert error["type"] == "error" and error["code"] == "not_in_flight", error
        stats = await aio.stats(queue)
        assert (stats.in_flight, stats.dequeued) == (1, 1)  # (the removed one counts as dequeued)


async def test_a_send_to_the_scheduler_management_topic_browses_and_removes_jobs():
    """As over STOMP (tests/gateway_ws/test_stomp_scheduler_management.py): the one implementation."""
    aio = runtime.async_broker()
    management = "topic://ActiveMQ.Scheduler.Management"
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="r", destination="queue://json.sched.replies")
        await request(ws, type="send", id=2, destination="queue://json.sched",
                      message={"body": "later", "delay": 3_600_000})
        answer, (browsed,) = await answer_and_messages(
            ws, 1, type="send", id=3, destination=management,
            message={"properties": {"AMQ_SCHEDULER_ACTION": "BROWSE"}, "reply_to": "queue://json.sched.replies"})
        assert answer["message_ids"] == [] and answer["jobs"] == [1]
        job = browsed["message"]
        assert job["body"] == "later" and job["type"] == "Advisory"
        assert job["properties"]["AMQ_SCHEDULED_DELAY"] == 3_600_000
        error = await request(ws, type="send", id=4, destination=management,
                              message={"properties": {"AMQ_SCHEDULER_ACTION": "REMOVE"}})
        assert error["type"] == "error" and "REMOVE needs scheduledJobId" in error["message"], error
        answer = await request(ws, type="send", id=5, destination=management, message={"properties": {
            "AMQ_SCHEDULER_ACTION": "REMOVE", "scheduledJobId": job["properties"]["scheduledJobId"]}})
        assert answer["jobs"] == [1]
    stats = await aio.stats("queue://json.sched")
    assert (stats.parked, stats.cancelled) == (0, 1)


async def test_a_delay_of_0_or_a_period_alone_makes_a_job_delivered_at_once():
    """As over STOMP and REST (the broker's rule, broker_core/messages.py): ActiveMQ's SchedulerBroker makes
    a job of a message sent with a delay or a period, 0 and a period without a repeat included, delivered
    at once, once, with scheduledJobId."""
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.now",
                      ack_mode="auto")
        for n, (body, schedule) in enumerate([("zero", {"delay": 0}), ("period", {"period": 200}),
                                              ("plain", {})], start=2):
            sent, (pushed,) = await answer_and_messages(ws, 1, type="send", id=n, destination="queue://json.now",
                                                        message={"body": body, **schedule})
            message = pushed["message"]
            job = message["properties"].get("scheduledJobId")
            assert (message["body"], job) == (body, None if body == "plain" else sent["message_ids"][0])
        with pytest.raises(asyncio.TimeoutError):  # (once: the period without a repeat)
            await asyncio.wait_for(receive_json(ws), 0.5)


async def test_a_batch_of_management_messages_with_a_bad_one_changes_nothing():
    """A `messages` batch to the management topic is checked whole before any acts (as a send's batch)."""
    aio = runtime.async_broker()
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="send", id=1, destination="queue://json.sched.batch",
                      message={"body": "later", "delay": 3_600_000})
        error = await request(ws, type="send", id=2, destination="topic://ActiveMQ.Scheduler.Management",
                              messages=[{"properties": {"AMQ_SCHEDULER_ACTION": "REMOVEALL"}},
                                        {"properties": {"AMQ_SCHEDULER_ACTION": "REMOVE"}}])
        assert error["type"] == "error" and "REMOVE needs scheduledJobId" in error["message"], error
    stats = await aio.stats("queue://json.sched.batch")
    assert (stats.parked, stats.cancelled) == (1, 0)


async def test_an_unsubscribe_leaves_a_transactions_acks_to_its_commit_or_abort():
    """A client-individual subscription ends with an ACK in an open transaction: its message is held for
    the transaction (neither redelivered nor consumed yet); the COMMIT consumes it, and after an ABORT
    it comes again, redelivered once (docs/broker_core.md "A transaction's acks of a consumer that
    closes")."""
    aio = runtime.async_broker()
    async with websocket("/ws/v1") as ws:
        await connected(ws)
        await request(ws, type="subscribe", id=1, subscription="s", destination="queue://json.h")
        _, pushed = await answer_and_messages(ws, 2, type="send", id=2, destination="queue://json.h",
                                              messages=[{"body": "kept"}, {"body": "undone"}])
        ids = {m["message"]["body"]: m["message"]["message_id"] for m in pushed}
        for n, (name, body) in enumerate((("c", "kept"), ("a", "undone"))):
            await request(ws, type="begin", id=10 + n, transaction=name)
            assert (await request(ws, type="ack", id=20 + n, subscription="s", transaction=name,
                                  message_id=ids[body]))["type"] == "ok"
        assert await request(ws, type="unsubscribe", id=3, subscription="s") == {"type": "ok", "id": 3}
        stats = await aio.stats("queue://json.h")
        assert (stats.pending, stats.in_flight, stats.consumer_count) == (0, 2, 0)
        assert await request(ws, type="commit", id=4, transaction="c") == {"type": "ok", "id": 4}
        assert await request(ws, type="abort", id=5, transaction="a") == {"type": "ok", "id": 5}
        _, (again,) = await answer_and_messages(ws, 1, type="subscribe", id=6, subscription="t",
                                                destination="queue://json.h")
        assert again["message"]["body"] == "undone" and again["message"]["delivery_count"] == 2
        stats = await aio.stats("queue://json.h")
        assert (stats.dequeued, stats.queue_size) == (1, 1)
