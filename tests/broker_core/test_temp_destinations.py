"""Temporary destinations in broker_core on the real Redis, with the fake clock: a queue or topic named by
the temporary name scheme belongs to the connection in its name; while that connection's lease in the
connection registry holds, maintenance leaves it, and once the lease lapsed (its gateway process died)
maintenance deletes it with its messages, counted once in the temporary-destination tally; a send to it is
then refused by name."""

from __future__ import annotations

import pytest

from broker_core import maintenance
from broker_core.connections import ConnectionRecord
from broker_core.destinations import matches, parse_destination, temporary_name
from broker_core.errors import InvalidDestination, OperationRefused
from broker_core.keys import temp_tally_key
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from broker_core.ops import admin
from broker_core.scripts import calls

from ..helpers.broker import consumer, drain

OWNER = "ws-0123456789abcdef"


def test_the_name_scheme_and_temp_schemes():
    queue = parse_destination("temp-queue://" + temporary_name(OWNER, 7))
    assert (queue.kind, queue.uri, queue.temporary_owner) == ("queue", f"queue://ID:{OWNER}:7", OWNER)
    topic = parse_destination(f"temp-topic://ID:{OWNER}:1")
    assert topic.is_topic and topic.is_temporary
    assert not parse_destination("queue://ID:someone:1").is_temporary  # not the scheme: an ordinary name
    with pytest.raises(InvalidDestination, match="temp-queue:// names one a connection created"):
        parse_destination("temp-queue://replies")


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_lapsed_owner_s_temp_destination_is_deleted_by_maintenance_and_counted(broker, clock, kind):
    broker.connection_put(ConnectionRecord(OWNER, "stomp+tcp", "p1", user="alice"), lease_ms=1000)
    dest = parse_destination(f"{kind}://{temporary_name(OWNER, 1)}")
    broker.ensure_destination(dest)
    if kind == "topic":  # its connection's subscription keeps what a topic holds (durable ones are refused)
        with pytest.raises(OperationRefused, match="durable subscription cannot be created for a temporary"):
            broker.add_consumer(dest, ConsumerSpec(client_id=OWNER, subscription_name="keep",
                                                   connection_id=OWNER))
        broker.add_consumer(dest, ConsumerSpec(prefetch=1, connection_id=OWNER))
    broker.send(dest, [Message(body="a"), Message(body="b")])
    assert broker.temp_destination_refusal(dest) is None
    maintenance.run_due(broker, [dest.uri])
    assert dest.uri in broker.destinations() and broker.temp_tally() == {"destinations": 0, "messages": 0}
    clock.advance(1500)  # the owner's process died: nobody renewed its lease
    assert "ended" in broker.temp_destination_refusal(dest)
    maintenance.run_due(broker, [dest.uri])
    assert dest.uri not in broker.destinations()
    assert broker.temp_tally() == {"destinations": 1, "messages": 2}
    maintenance.run_due(broker, [dest.uri])  # gone already: counted once
    assert broker.temp_tally() == {"destinations": 1, "messages": 2}
    assert "no temporary destination" in broker.temp_destination_refusal(dest)


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_only_the_owning_connection_may_consume_from_a_temporary_destination(broker, kind):
    """The owner check is broker_core's, so every adapter has it: the JSON protocol and REST consume by
    the plain name (`queue://ID:<connection>:<n>`), which a wildcard grant may allow."""
    dest = parse_destination(f"{kind}://{temporary_name(OWNER, 3)}")
    broker.ensure_destination(dest)
    for stranger in (None, "ws-fedcba9876543210", "http-c1"):
        with pytest.raises(OperationRefused, match=f"temporary {kind} created by another connection"):
            broker.add_consumer(dest, ConsumerSpec(connection_id=stranger))
    broker.add_consumer(dest, ConsumerSpec(connection_id=OWNER))


def test_patterns_never_match_a_temporary_destination_and_near_misses_are_ordinary(broker):
    """A temporary destination is a type of its own (ActiveMQ's DestinationFilter destinationType): a `*`
    subscription gets nothing sent to one, while names that only look like one (destinations.TEMP_NAME is
    strict: upper-case hex, another transport, a leading 0) are ordinary topics it does get. The Lua side
    (wildcard.is_temporary) decides the same as the Python side (`matches`)."""
    temporary = f"ID:{OWNER}:1"
    near_misses = ["ID:ws-0123456789ABCDEF:1", "ID:http-0123456789abcdef:1", f"ID:{OWNER}:01",
                   "ID:ws-0123456789abcde:1", f"ID:{OWNER}:1234567890"]
    pattern = parse_destination("topic://*", allow_wildcards=True)
    assert not matches(pattern, parse_destination(f"topic://{temporary}"))
    assert matches(pattern, parse_destination(f"topic://{temporary}"), with_temporary=True)
    assert all(matches(pattern, parse_destination(f"topic://{name}")) for name in near_misses)
    spy = consumer(broker, "topic://*", prefetch=100)
    own = consumer(broker, f"topic://{temporary}", prefetch=100, connection_id=OWNER)
    for name in [temporary, *near_misses]:
        broker.send(f"topic://{name}", Message(body=name))
    assert [d.body for d in drain(broker, own)] == [temporary]
    assert sorted(d.body for d in drain(broker, spy)) == sorted(near_misses)


def test_the_step_that_counts_a_deletion_also_unlists_the_destination(broker):
    """One script both counts a temporary destination's deletion and removes its registry entry: a reader
    (the console, a test waiting for the tally) never sees it counted while it is still listed, and no
    crash between two calls leaves it listed without its keys."""
    dest = parse_destination(f"queue://{temporary_name(OWNER, 3)}")
    broker.send(dest, [Message(body="a")])
    tally = temp_tally_key(broker.namespace)
    step = calls.DestinationDelete.call(broker.ops.prefix(dest), 0, broker.ops.registry_key, dest.uri, tally,
                                        admin.DELETE_CHUNK, broker.ops.deletions_key)
    assert calls.DestinationDelete.parse(broker._step(step)) == (1, True)
    assert dest.uri not in broker.destinations()
    assert broker.temp_tally() == {"destinations": 1, "messages": 1}
    assert calls.DestinationDelete.parse(broker._step(step)) == (0, False)  # gone: counted once
    assert broker.temp_tally() == {"destinations": 1, "messages": 1}
