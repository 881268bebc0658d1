"""ActiveMQ's scheduler management over STOMP (WebSocket and TCP, real sockets): a SEND to
/topic/ActiveMQ.Scheduler.Management with AMQ_SCHEDULER_ACTION BROWSE sends each scheduled job to its
reply-to, REMOVE cancels one job by its scheduledJobId, REMOVEALL every job (due within
ACTION_START_TIME..ACTION_END_TIME when given), each limited to the destinations the user has the right
to read (browse) or administer (cancel); bad input is an ERROR that names it and changes nothing.

The gateway's namespace is shared by the session's tests, so a test looks only at its own queue's jobs
(replies filtered by original-destination, statistics of its queue)."""

from __future__ import annotations

import time
import uuid

import pytest

from broker_core.errors import UnknownDestination

pytestmark = pytest.mark.e2e

MANAGEMENT = "/topic/ActiveMQ.Scheduler.Management"
HOUR = 3_600_000


@pytest.fixture(params=["ws", "tcp"])
def stomp_transport(request) -> str:
    return request.param


def schedule(client, queue: str, body: str, delay: int, **headers: str) -> None:
    client.receipt(client.conn.send, f"/queue/{queue}", body, headers={"AMQ_SCHEDULED_DELAY": str(delay),
                                                                       **headers})


def manage(client, action: str | None, **headers: str) -> None:
    """A management SEND, answered by its RECEIPT."""
    if action is not None:
        headers["AMQ_SCHEDULER_ACTION"] = action
    client.receipt(client.conn.send, MANAGEMENT, "", headers=headers)


def replies(client, queue: str) -> list:
    """What a BROWSE sent to `client`'s reply subscription, its queue's jobs alone. (The reply subscriber
    is another connection than the one that sends the BROWSE: on one connection its RECEIPT and the
    replies may come in either order.)"""
    got = []
    while not client.silent(0.5):
        got.append(client.expect("MESSAGE"))
    return [m for m in got if m.headers.get("original-destination") == f"/queue/{queue}"]


def browse(client, reader, queue: str, **headers: str) -> list:
    manage(client, "BROWSE", **{"reply-to": reader.reply_to}, **headers)
    return replies(reader, queue)


@pytest.fixture
def reader(clients):
    """A connection subscribed to a reply queue of its own (`reader.reply_to`)."""
    client = clients()
    client.reply_to = f"/queue/replies{uuid.uuid4().hex[:8]}"
    client.receipt(client.conn.subscribe, client.reply_to, id="r")
    return client


def test_browse_sends_each_job_to_the_reply_to_and_the_management_message_to_nobody(
        clients, queue_name, reader, broker):
    client, watcher = clients(), clients()
    watcher.receipt(watcher.conn.subscribe, MANAGEMENT, id="m")
    schedule(client, queue_name, "later", HOUR, foo="bar", priority="7")
    schedule(client, queue_name, "sooner", HOUR // 2, **{"AMQ_SCHEDULED_PERIOD": "5000",
                                                         "AMQ_SCHEDULED_REPEAT": "3"})
    got = browse(client, reader, queue_name)
    assert [m.body for m in got] == [b"sooner", b"later"]  # in the order they come due
    sooner, later = got
    assert later.headers["type"] == "Advisory" and later.headers["foo"] == "bar"
    assert later.headers["priority"] == "7" and later.headers["AMQ_SCHEDULED_DELAY"] == str(HOUR)
    assert "persistent" not in later.headers and "AMQ_SCHEDULED_REPEAT" not in later.headers
    # a repeating job shows the schedule it was sent with, its whole repeat
    assert (sooner.headers["AMQ_SCHEDULED_PERIOD"], sooner.headers["AMQ_SCHEDULED_REPEAT"]) == ("5000", "3")
    parked = {b.message.message_id for b in broker.browse(f"queue://{queue_name}").messages}
    assert {m.headers["scheduledJobId"] for m in got} == parked  # the ids REMOVE takes
    assert {m.headers["message-id"] for m in got}.isdisjoint(parked)  # each sent as a new message
    assert watcher.silent(0.3)  # the management message is the broker's, delivered to no subscriber
    assert broker.stats(f"queue://{queue_name}").parked == 2  # browsing changed nothing


def test_a_time_range_selects_jobs_by_when_they_are_due(clients, queue_name, reader, broker):
    client = clients()
    now = int(time.time() * 1000)
    for n in (1, 2, 3):
        schedule(client, queue_name, f"job{n}", n * HOUR)
    due = {b.message.body.decode(): when["due"] for b in broker.browse(f"queue://{queue_name}").messages
           for when in [broker.parked_times(f"queue://{queue_name}", [b.message.message_id])
                        [b.message.message_id]]}
    window = {"ACTION_START_TIME": str(due["job2"]), "ACTION_END_TIME": str(due["job3"])}  # inclusive
    assert [m.body for m in browse(client, reader, queue_name, **window)] == [b"job2", b"job3"]
    manage(client, "REMOVEALL", ACTION_START_TIME=str(now), ACTION_END_TIME=str(due["job2"]))
    assert [m.body for m in browse(client, reader, queue_name)] == [b"job3"]
    assert broker.stats(f"queue://{queue_name}").cancelled == 2


def test_remove_cancels_the_job_a_browse_named_and_it_never_arrives(clients, queue_name, reader, broker):
    client, consumer = clients(), clients()
    consumer.receipt(consumer.conn.subscribe, f"/queue/{queue_name}", id="c")
    schedule(client, queue_name, "cancel me", 4000)
    schedule(client, queue_name, "keep me", 4000)
    (job,) = [m for m in browse(client, reader, queue_name) if m.body == b"cancel me"]
    manage(client, "REMOVE", scheduledJobId=job.headers["scheduledJobId"])
    assert consumer.expect("MESSAGE", timeout=8).body == b"keep me"
    assert consumer.silent(0.5)
    stats = broker.stats(f"queue://{queue_name}")
    assert (stats.cancelled, stats.enqueued) == (1, 1)  # cancelled, never enqueued (remove_message's count)


def test_remove_of_an_unknown_job_is_an_error_naming_it(clients, queue_name, broker):
    client = clients()
    schedule(client, queue_name, "stays", HOUR)
    client.conn.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "REMOVE", "scheduledJobId": "ID:nope"})
    assert "no scheduled job ID:nope" in client.expect("ERROR").headers["message"]
    assert broker.stats(f"queue://{queue_name}").parked == 1


@pytest.mark.parametrize(("headers", "named"), [
    ({}, "needs AMQ_SCHEDULER_ACTION"),
    ({"AMQ_SCHEDULER_ACTION": "browse"}, "AMQ_SCHEDULER_ACTION must be one of BROWSE, REMOVE, REMOVEALL"),
    ({"AMQ_SCHEDULER_ACTION": "REMOVE"}, "REMOVE needs scheduledJobId"),
    ({"AMQ_SCHEDULER_ACTION": "BROWSE"}, "BROWSE needs reply-to"),
    ({"AMQ_SCHEDULER_ACTION": "REMOVEALL", "ACTION_START_TIME": "0"},
     "ACTION_START_TIME needs ACTION_END_TIME"),
    ({"AMQ_SCHEDULER_ACTION": "REMOVEALL", "ACTION_START_TIME": "abc", "ACTION_END_TIME": "1"},
     "ACTION_START_TIME must be a time in ms"),
    # what Java's Long.valueOf refuses and Python's int takes: digit separators, spaces, past a long
    ({"AMQ_SCHEDULER_ACTION": "REMOVEALL", "ACTION_START_TIME": "0", "ACTION_END_TIME": "1_000"},
     "ACTION_END_TIME must be a time in ms"),
    ({"AMQ_SCHEDULER_ACTION": "REMOVEALL", "ACTION_START_TIME": " 5", "ACTION_END_TIME": "9"},
     "ACTION_START_TIME must be a time in ms"),
    ({"AMQ_SCHEDULER_ACTION": "REMOVEALL", "ACTION_START_TIME": "0", "ACTION_END_TIME": "9" * 20},
     "ACTION_END_TIME must be a time in ms"),
    # a transaction never begun is refused as on any SEND (ActiveMQ's ProtocolConverter too), not acted on
    ({"AMQ_SCHEDULER_ACTION": "REMOVEALL", "transaction": "never-begun"},
     "Invalid transaction id: never-begun"),
])
def test_bad_management_messages_are_errors_naming_the_header_and_change_nothing(
        clients, queue_name, broker, headers, named):
    client = clients()
    schedule(client, queue_name, "stays", HOUR)
    client.conn.send(MANAGEMENT, "", headers=headers)
    assert named in client.expect("ERROR").headers["message"]
    schedule(client, queue_name, "the connection goes on", HOUR)
    stats = broker.stats(f"queue://{queue_name}")
    assert (stats.parked, stats.cancelled) == (2, 0)


def test_a_user_sees_and_cancels_only_the_jobs_of_destinations_it_may(clients, queue_name, broker):
    alice = clients()
    carol, carols_reader = clients("carol", "secret"), clients("carol", "secret")
    carols = f"carol.{queue_name}"
    schedule(alice, queue_name, "alice's", HOUR)
    schedule(alice, carols, "carol's", HOUR)
    carols_reader.receipt(carols_reader.conn.subscribe, f"/queue/carol.{queue_name}.replies", id="r")
    manage(carol, "BROWSE", **{"reply-to": f"/queue/carol.{queue_name}.replies"})
    got = []
    while not carols_reader.silent(0.5):
        got.append(carols_reader.expect("MESSAGE"))
    assert [m.body for m in got] == [b"carol's"]  # (alice's jobs elsewhere are not hers to see)
    manage(carol, "REMOVEALL")
    assert broker.stats(f"queue://{carols}").cancelled == 1
    assert broker.stats(f"queue://{queue_name}").parked == 1  # not hers: left alone
    (job,) = broker.browse(f"queue://{queue_name}").messages
    carol.conn.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "REMOVE",
                                             "scheduledJobId": job.message.message_id})
    assert "may administer" in carol.expect("ERROR").headers["message"]
    assert broker.stats(f"queue://{queue_name}").parked == 1
    bob = clients("bob", "secret")  # no right to write to the management topic
    bob.conn.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "REMOVEALL"})
    assert "not authorized to write to: topic://ActiveMQ.Scheduler.Management" in \
        bob.expect("ERROR").headers["message"]


def test_a_topics_jobs_are_browsed_and_removed_too(clients, reader, broker):
    client = clients()
    topic = f"t{uuid.uuid4().hex[:10]}"
    client.receipt(client.conn.send, f"/topic/{topic}", "to the topic",
                   headers={"AMQ_SCHEDULED_DELAY": str(HOUR)})
    manage(client, "BROWSE", **{"reply-to": reader.reply_to})
    got = []
    while not reader.silent(0.5):
        got.append(reader.expect("MESSAGE"))
    (job,) = [m for m in got if m.headers.get("original-destination") == f"/topic/{topic}"]
    manage(client, "REMOVE", scheduledJobId=job.headers["scheduledJobId"])
    stats = broker.stats(f"topic://{topic}")
    assert (stats.parked, stats.cancelled) == (0, 1)


def test_a_temporary_queues_jobs_are_its_connections_alone(clients, broker):
    """A temporary queue's messages are its connection's (ActiveMQ refuses another connection's browser of
    one; REST shows them to staff alone): another connection's BROWSE does not list its jobs and its
    REMOVEALL leaves them, even the same user's (carol: no staff, no right on the queue), nor a staff user's
    without a grant on it (permissions.contents_allowed, the REST API's rule); its own connection's does."""
    owner, other, reader = clients("carol"), clients("carol"), clients()
    reader.reply_to = f"/queue/carol.replies{uuid.uuid4().hex[:8]}"  # (carol may write there)
    reader.receipt(reader.conn.subscribe, reader.reply_to, id="r")
    owner.receipt(owner.conn.send, "/temp-queue/later", "mine", headers={"AMQ_SCHEDULED_DELAY": str(HOUR)})
    (temp,) = [d for d in broker.destinations() if "ID:" in d and broker.stats(d).parked == 1
               and any(m.message.body == b"mine" for m in broker.browse(d).messages)]
    name = temp.split("://", 1)[1]

    def listed(client) -> list:
        manage(client, "BROWSE", **{"reply-to": reader.reply_to})
        got = []
        while not reader.silent(0.5):
            got.append(reader.expect("MESSAGE"))
        return [m for m in got if name in m.headers.get("original-destination", "")]

    for stranger in (other, clients("sam")):  # (sam: staff, without a grant on the queue, as REST asks)
        assert listed(stranger) == []
        manage(stranger, "REMOVEALL")
        assert broker.stats(temp).parked == 1
    assert [m.body for m in listed(owner)] == [b"mine"]
    manage(owner, "REMOVEALL")
    assert (broker.stats(temp).parked, broker.stats(temp).cancelled) == (0, 1)


def test_a_browse_to_a_full_reply_to_is_an_error_naming_its_limit_and_sends_nothing(clients, queue_name,
                                                                                      broker):
    """A BROWSE is admitted as a producer's send to its reply-to (docs/broker_core.md "Scheduler
    management"): to a full one it is refused as a SEND there is, its ERROR carrying the receipt id and
    ActiveMQ's text, and no job is sent (repeated BROWSEs can no longer fill Redis with copies)."""
    replies = f"{queue_name}.replies"
    broker.policies.set_entry("queue", replies, {"memoryLimit": 2048, "sendFailIfNoSpace": True})
    client = clients()
    schedule(client, queue_name, "later", HOUR)
    client.receipt(client.conn.send, f"/queue/{replies}", "x" * 1500)  # (what is left holds no job)
    client.conn.send(MANAGEMENT, "", receipt="b1",
                     headers={"AMQ_SCHEDULER_ACTION": "BROWSE", "reply-to": f"/queue/{replies}"})
    error = client.expect("ERROR")
    assert error.headers["receipt-id"] == "b1"
    assert error.headers["message"].startswith(f"Usage Manager Memory Limit reached on queue://{replies}")
    stats = broker.stats(f"queue://{replies}")
    assert (stats.enqueued, stats.blocked_sends) == (1, 1)
    assert broker.stats(f"queue://{queue_name}").parked == 1


def test_a_browsed_cron_job_carries_its_expression(clients, queue_name, reader):
    """As ActiveMQ's job store keeps the message as sent, a BROWSE's copy of a cron job has its
    AMQ_SCHEDULED_CRON."""
    client = clients()
    client.receipt(client.conn.send, f"/queue/{queue_name}", "nightly",
                   headers={"AMQ_SCHEDULED_CRON": "0 3 * * *"})
    (job,) = browse(client, reader, queue_name)
    assert job.headers["AMQ_SCHEDULED_CRON"] == "0 3 * * *"


def test_a_browse_needs_write_on_its_reply_to_but_not_on_a_temporary_one(clients, queue_name, broker):
    """A BROWSE's replies are sends to its reply-to: refused, naming it, where the user may not write
    (gateway.permissions.reply_to_refusal, the REST send's check too: the same text), before any job is
    sent; a temporary reply-to needs no grant, as a STOMP SEND there (ActiveMQ checks none)."""
    alice = clients()
    schedule(alice, f"carol.{queue_name}", "hers", HOUR)
    carol = clients("carol", "secret")
    carol.conn.send(MANAGEMENT, "", headers={"AMQ_SCHEDULER_ACTION": "BROWSE",
                                             "reply-to": f"/queue/elsewhere.{queue_name}"})
    assert carol.expect("ERROR").headers["message"] == (
        f"User carol is not authorized to write to: queue://elsewhere.{queue_name} (the BROWSE's reply-to, "
        "where its jobs go)")
    with pytest.raises(UnknownDestination):  # (nothing was ever sent there)
        broker.stats(f"queue://elsewhere.{queue_name}")
    carol = clients("carol", "secret")
    carol.receipt(carol.conn.subscribe, "/temp-queue/jobs", id="t")
    # (its RECEIPT and the replies on the same connection may come in either order)
    carol.conn.send(MANAGEMENT, "", receipt="browsed",
                    headers={"AMQ_SCHEDULER_ACTION": "BROWSE", "reply-to": "/temp-queue/jobs"})
    got = []
    while not carol.silent(0.5):
        got.append(carol.next())
    assert [f.headers.get("receipt-id") for f in got if f.command == "RECEIPT"] == ["browsed"]
    assert [f.body for f in got if f.command == "MESSAGE"
            and f.headers.get("original-destination") == f"/queue/carol.{queue_name}"] == [b"hers"]
