"""One connection per client id, across every gateway process (ActiveMQ's RegionBroker.addConnection):
a second connection that gives a client id already in use is refused with InvalidClientIDException's
text. The claim is kept by the broker (broker_core/client_ids.py: a key holding the owning connection and its
remote address, with a lease the connection renews while it lives, gateway/ws/link.py, and deletes when it
ends; a gateway process that dies leaves a claim that lapses with the lease, so the id is free again
within one lease instead of blocked forever); this module words ActiveMQ's refusal.
"""

from __future__ import annotations

from typing import Any

from broker_core.broker import advisory


class ClientIdInUse(Exception):
    def __init__(self, client_id: str, holder_address: str) -> None:
        # ActiveMQ's InvalidClientIDException, word for word (broker name: SIGNALBOX_BROKER_NAME)
        super().__init__(f"Broker: {advisory.BROKER_NAME} - Client: {client_id} "
                         f"already connected from {holder_address}")
        self.client_id = client_id
        self.holder_address = holder_address


class ClientIdClaim:
    """The claim of one connection on one client id, held through the broker (broker_core/client_ids.py)."""

    def __init__(self, broker: Any, client_id: str, connection_id: str, address: str) -> None:
        self.broker = broker
        self.client_id = client_id
        # the value names the holder: its connection (to compare) and its address (for the refusal)
        self.value = f"{connection_id}|{address}"

    async def take(self, lease_ms: int) -> None:
        """Claim the id for `lease_ms`, or raise ClientIdInUse naming where the holder connected from."""
        held = await self.broker.claim_client_id(self.client_id, self.value, lease_ms)
        if held is None:
            return
        holder = held.partition("|")[2]
        raise ClientIdInUse(self.client_id, holder or "an unknown address")

    async def renew(self, lease_ms: int) -> bool:
        """Extend the lease; False when the claim lapsed (this process stalled longer than the lease)."""
        return bool(await self.broker.renew_client_id(self.client_id, self.value, lease_ms))

    async def release(self) -> None:
        await self.broker.release_client_id(self.client_id, self.value)
