"""Ids of HTTP consumers: they carry what every later request needs, signed.

An HTTP consumer is a broker_core consumer; its id is `http-<ack><lease ms>-<random>-<user id>-<mac>`,
e.g. `http-i30000-3f9a0c2e-7-5a1b...`. The ack mode (its letter upper-case for a pull consumer,
prefetch 0) and lease let receive/ack/heartbeat build the broker call without reading anything,
the user id says whose it is, and the MAC (HMAC-SHA256 over the destination and the rest, keyed by
SECRET_KEY) proves the gateway issued it for that destination and user. So any gateway process can
serve any request and no lookup sits on the hot path.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.conf import settings

from broker_core.destinations import Destination
from broker_core.model import ConsumerRef

_ACK_CODES = {"auto": "a", "client": "c", "client-individual": "i"}
_ACK_MODES = {code: mode for mode, code in _ACK_CODES.items()}
PREFIX = "http-"


@dataclass(frozen=True)
class HttpConsumer:
    consumer_id: str
    destination: Destination
    ack_mode: str
    lease_ms: int
    user_id: int
    pull: bool = False

    @property
    def ref(self) -> ConsumerRef:
        return ConsumerRef(self.destination, self.consumer_id, self.ack_mode)  # type: ignore[arg-type]


def _mac(destination: Destination, body: str) -> str:
    key = hashlib.sha256(b"gateway.consumer:" + settings.SECRET_KEY.encode()).digest()
    return hmac.new(key, f"{destination.uri}|{body}".encode(), hashlib.sha256).hexdigest()[:20]


def new_consumer_id(destination: Destination, ack_mode: str, lease_ms: int, user_id: int,
                    pull: bool = False) -> str:
    code = _ACK_CODES[ack_mode].upper() if pull else _ACK_CODES[ack_mode]
    body = f"{PREFIX}{code}{lease_ms}-{secrets.token_hex(5)}-{user_id}"
    return f"{body}-{_mac(destination, body)}"


def parse_consumer_id(destination: Destination, consumer_id: str) -> HttpConsumer | None:
    """The consumer the id describes, or None when it is not a valid HTTP consumer id of `destination`."""
    if not consumer_id.startswith(PREFIX):
        return None
    body, _, mac = consumer_id.rpartition("-")
    if not hmac.compare_digest(mac, _mac(destination, body)):
        return None
    try:
        mode_lease, _random, user = body[len(PREFIX):].split("-")
        code = mode_lease[0]
        return HttpConsumer(consumer_id, destination, _ACK_MODES[code.lower()], int(mode_lease[1:]),
                            int(user), pull=code.isupper())
    except (ValueError, KeyError, IndexError):
        return None
