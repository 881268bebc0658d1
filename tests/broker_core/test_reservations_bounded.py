"""A send's flow check without reading every open transaction's reservation (session 30): the entries under
`<destination>:memres` and the broker's `<ns>:usage:res` are also summed as they are written (meta `memres`,
the usage hash's `res`; flow.lua flow.reserved_sum), every entry counted, live or not, so the sum is never
below what the live ones hold; a send that fits with the sums reads no entry, one that would not reads them
all as before (dropping those of transactions that are gone) and writes the sums again. Each check also
looks at a few entries, any of them, and drops those whose transaction is gone."""

from __future__ import annotations

import pytest

from broker_core.errors import ResourceAllocationError
from broker_core.messages import Message

# counts what the server ran (INFO commandstats): on a server of its own (tests/conftest.py redis_url)
pytestmark = pytest.mark.private_redis

OPEN = 300
KB = "x" * 1024


def command_calls(client, name: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def sums(broker, redis_client, dest: str) -> tuple[int, int]:
    meta = redis_client.hget(f"{broker.namespace}:{{q:{dest}}}:meta", "memres")
    usage = redis_client.hget(f"{broker.namespace}:usage", "res")
    return int(meta or 0), int(usage or 0)


def test_a_send_that_fits_reads_no_reservation(broker, redis_client, policy):
    policy("held", memoryLimit=64 * 1024 * 1024)
    txs = [broker.begin() for _ in range(OPEN)]
    for tx in txs:
        broker.send("held", Message(body="r"), tx=tx)
    reads = command_calls(redis_client, "exists")
    broker.send("held", Message(body="plain"))
    # (each entry's transaction key was looked up, the destination's and the broker's: 2 an open transaction;
    # now flow.lua RESERVED_LOOKS (8) of each, any of them, to drop those of transactions that are gone)
    assert command_calls(redis_client, "exists") - reads <= 2 * 8 + 4
    for tx in txs[:100]:
        broker.commit(tx)
    for tx in txs[100:]:
        broker.rollback(tx)
    assert sums(broker, redis_client, "held") == (0, 0)
    assert broker.stats("held").queue_size == 101


def test_a_gone_transaction_stops_counting_when_the_sum_would_refuse(broker, redis_client, policy):
    policy("tight", memoryLimit=3 * 1100, sendFailIfNoSpace=True)
    gone = broker.begin(ttl_ms=60_000)
    broker.send("tight", [Message(body=KB), Message(body=KB)], tx=gone)
    alive = broker.begin()
    broker.send("tight", Message(body=KB), tx=alive)
    with pytest.raises(ResourceAllocationError):
        broker.send("tight", Message(body=KB))
    # the first transaction's owner died: its key is gone, its entries are still there and in the sums
    redis_client.delete(f"{broker.namespace}:tx:{gone}")
    held, _ = sums(broker, redis_client, "tight")
    assert held >= 3 * 1024
    broker.send("tight", Message(body=KB))  # over with the sum, so read one by one: fits
    held, _ = sums(broker, redis_client, "tight")
    assert 1024 <= held < 2 * 1024  # what the live transaction holds
    broker.commit(alive)
    assert sums(broker, redis_client, "tight")[0] == 0
