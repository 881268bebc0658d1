"""ActiveMQ.Advisory.Connection from broker_core's side (spec §11): `advise_connection` publishes a
ConnectionInfo or RemoveInfo through the same direct path as a deleted destination's advisory, only while
someone subscribes to the topic."""

from __future__ import annotations

import json

from broker_core.model import ConsumerSpec
from broker_core.ops import advisory

from .conftest import drain


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
