"""One connection per client id, across every gateway process (ActiveMQ's RegionBroker.addConnection):
a second connection that gives a client id already in use is refused with InvalidClientIDException's
text. The claim is a Redis key `<namespace>:clientid:<client id>` holding the owning connection and its
remote address, with a lease the connection renews while it lives (gateway/ws/link.py) and deletes when it
ends; a gateway process that dies leaves a claim that lapses with the lease, so the id is free again
within one lease instead of blocked forever.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

# Compare-and-renew and compare-and-delete: only the connection that holds the claim touches it.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class ClientIdInUse(Exception):
    def __init__(self, client_id: str, holder_address: str) -> None:
        # ActiveMQ's InvalidClientIDException, word for word (broker name: SIGNALBOX_BROKER_NAME)
        super().__init__(f"Broker: {settings.SIGNALBOX_BROKER_NAME} - Client: {client_id} "
                         f"already connected from {holder_address}")
        self.client_id = client_id
        self.holder_address = holder_address


class ClientIdClaim:
    """The claim of one connection on one client id."""

    def __init__(self, redis: Any, namespace: str, client_id: str, connection_id: str, address: str) -> None:
        self.redis = redis
        self.key = f"{namespace}:clientid:{client_id}"
        self.client_id = client_id
        # the value names the holder: its connection (to compare) and its address (for the refusal)
        self.value = f"{connection_id}|{address}"

    async def take(self, lease_ms: int) -> None:
        """Claim the id for `lease_ms`, or raise ClientIdInUse naming where the holder connected from."""
        if await self.redis.set(self.key, self.value, nx=True, px=lease_ms):
            return
        held = await self.redis.get(self.key)
        holder = (held or b"").decode("utf-8", "replace").partition("|")[2]
        # it lapsed or was released between the two calls: try once more
        if held is None and await self.redis.set(self.key, self.value, nx=True, px=lease_ms):
            return
        raise ClientIdInUse(self.client_id, holder or "an unknown address")

    async def renew(self, lease_ms: int) -> bool:
        """Extend the lease; False when the claim lapsed (this process stalled longer than the lease)."""
        return bool(await self.redis.eval(_RENEW, 1, self.key, self.value, lease_ms))

    async def release(self) -> None:
        await self.redis.eval(_RELEASE, 1, self.key, self.value)
