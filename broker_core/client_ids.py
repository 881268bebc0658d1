"""One connection per client id, across every gateway process (ActiveMQ's RegionBroker.addConnection).

The claim is a key `<namespace>:clientid:<client id>` holding the owning connection and its remote address
(`<connection id>|<address>`), with a lease the connection renews while it lives and deletes when it ends;
a process that dies leaves a claim that lapses with the lease, so the id is free again within one lease
instead of blocked forever. Plain commands next to the broker's other keys, run by the driver loop through
the facade (Broker.claim_client_id, renew_client_id, release_client_id); the adapters word the refusal.
"""

from __future__ import annotations

from .effects import Command, Op

# Compare-and-renew and compare-and-delete: only the connection that holds the claim touches it.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def claim_key(namespace: str, client_id: str) -> str:
    return f"{namespace}:clientid:{client_id}"


def claim(namespace: str, client_id: str, holder: str, lease_ms: int) -> Op[str | None]:
    """Claim `client_id` for `holder` for `lease_ms`: None when taken, else the holder value of the
    connection that has it (b"" read as "" when it lapsed in between and the second try failed too)."""
    key = claim_key(namespace, client_id)
    if (yield Command(("SET", key, holder, "NX", "PX", lease_ms))):
        return None
    held = yield Command(("GET", key))
    # it lapsed or was released between the two calls: try once more
    if held is None and (yield Command(("SET", key, holder, "NX", "PX", lease_ms))):
        return None
    return (held or b"").decode("utf-8", "replace") if isinstance(held, bytes | None) else str(held)


def renew(namespace: str, client_id: str, holder: str, lease_ms: int) -> Op[bool]:
    """Extend `holder`'s lease; False when its claim lapsed."""
    return bool((yield Command(("EVAL", _RENEW, 1, claim_key(namespace, client_id), holder, lease_ms))))


def release(namespace: str, client_id: str, holder: str) -> Op[None]:
    yield Command(("EVAL", _RELEASE, 1, claim_key(namespace, client_id), holder))
