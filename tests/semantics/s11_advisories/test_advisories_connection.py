"""ActiveMQ.Advisory.Connection from broker_core's side (spec §11): `advise_connection` publishes a
ConnectionInfo or RemoveInfo through the same path as a deleted destination's advisory (a record in the
advisory topic's own outbox, delivered at once), only while someone subscribes to the topic."""

from __future__ import annotations

import json

import pytest
import redis

from broker_core import maintenance
from broker_core.drivers.loop import typed_error
from broker_core.effects import Eval
from broker_core.model import ConsumerSpec
from broker_core.ops import advisory

from ...helpers.broker import drain


def test_without_a_subscriber_no_connection_advisory_topic_appears(broker):
    broker.advise_connection("ws-1", added=True, user="alice")
    broker.advise_connection("ws-1", added=False)
    assert advisory.CONNECTION_TOPIC.uri not in broker.destinations()


def test_connection_info_and_remove_info_are_published_with_the_password_blank(broker):
    watcher = broker.add_consumer(advisory.CONNECTION_TOPIC, ConsumerSpec(ack_mode="auto"))
    assert watcher.destination.uri == "topic://ActiveMQ.Advisory.Connection"
    broker.advise_connection("ws-1", added=True, client_id="app-1", user="alice", address="ws://10.0.0.1:5",
                             protocol="stomp")
    broker.advise_connection("ws-1", added=False, reason="DISCONNECT")
    got = drain(broker, watcher)
    assert [(d.type, d.persistent, d.properties) for d in got] == [
        ("Advisory", False, {"originBrokerName": "localhost"})] * 2
    added, removed = (json.loads(d.body) for d in got)
    assert added["ConnectionInfo"] == {"connectionId": "ws-1", "clientId": "app-1", "userName": "alice",
                                       "password": "", "clientIp": "ws://10.0.0.1:5", "protocol": "stomp"}
    assert removed["RemoveInfo"] == {"objectId": "ws-1", "reason": "DISCONNECT"}
    assert removed["event"]["type"] == "connection_remove"
    assert len({d.message_id for d in got}) == 2 and all(d.message_id.startswith("ID:advisory:connection:")
                                                         for d in got)


class Crash(Exception):
    """The process 'dies' here: the request that matched is never run."""


def test_a_connection_advisory_recorded_before_a_crash_is_delivered_once_by_maintenance(broker, clock):
    """The advisory is written to the advisory topic's outbox before it is published: a process that dies
    between the two leaves the record, which maintenance delivers (once) after the forwarding grace."""
    watcher = broker.add_consumer(advisory.CONNECTION_TOPIC, ConsumerSpec(ack_mode="auto"))
    info = {"connection": "ws-9", "client": "app-9", "user": "bob", "address": None, "protocol": "stomp",
            "reason": None}
    op = broker.ops.connection_changed(info, clock.now_ms(), True)
    outbox = f"{broker.ops.prefix(advisory.CONNECTION_TOPIC)}:fwd"
    request = next(op)
    with pytest.raises(Crash):  # drive it as Broker._run does, dying at the publication's MULTI/EXEC
        while True:
            if isinstance(request, list) and any(isinstance(c, Eval) and c.script == "topic_send"
                                                 for c in request):
                op.close()
                raise Crash
            try:
                reply = broker._step(request)
            except redis.ResponseError as exc:
                request = op.throw(typed_error(exc))
            else:
                request = op.send(reply)
    assert broker.redis.hlen(outbox) == 1  # the record survived the crash
    assert drain(broker, watcher) == []
    maintenance.run_due(broker)  # the tick finds it (the maintenance index) and waits the grace
    assert broker.redis.hlen(outbox) == 1 and drain(broker, watcher) == []
    clock.advance(maintenance.FORWARD_GRACE_MS + 1)
    maintenance.run_due(broker)
    (got,) = drain(broker, watcher)
    assert json.loads(got.body)["ConnectionInfo"]["connectionId"] == "ws-9"
    assert broker.redis.hlen(outbox) == 0
    clock.advance(maintenance.FORWARD_GRACE_MS + 1)
    maintenance.run_due(broker)
    assert drain(broker, watcher) == []

