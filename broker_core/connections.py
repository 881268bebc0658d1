"""The connection registry: which client connections the gateway processes hold (STOMP over TCP and
WebSocket, the JSON WebSocket protocol, REST consumers), with their subscriptions and producers, and the
operator's request to close one. ActiveMQ's console lists its connections from the broker's memory;
Signalbox's connections live in many gateway processes, so each process writes what it holds here
(scripts/lua/connections.lua) and the console reads it back.

Every adapter goes through this one set of functions:

- `ConnectionRecord`: a connection as its process knows it. The adapter calls `subscribed`,
  `unsubscribed` and `sent` as frames arrive (memory only, no Redis call); `delta()` says what changed
  since the last write.
- `put` (register, and every later write of a delta), `renew` (the process's heartbeat: one call for many
  connections), `drop` (unregister), `list_page` (a cursor page), `get`, `request_close`, `take_closes`:
  generators of Redis calls, run by either driver (`Broker.connections` / `AsyncBroker.connections`).

Bounded: at most `limit` connections are registered (SIGNALBOX_CONNECTION_REGISTRY_LIMIT; past it a new
connection is refused with ConnectionRegistryFull naming the setting), a record lists at most
PRODUCER_LIMIT destinations it sent to (sends to others are counted in `producers_untracked`), a list call
examines at most `count` ids. Each entry has a lease its process renews; a process that dies stops
renewing, and its connections drop out of the list when the lease lapses (the listing purges them).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

from .effects import Command
from .scripts import calls

PRODUCER_LIMIT = 100  # destinations one connection's producer rows name
DEFAULT_LEASE_MS = 15_000
DEFAULT_LIMIT = 100_000
LIST_MAX = 200  # ids one list call examines, at most (500 full rows took 21 ms of Redis under load)
RENEW_CHUNK = 200  # connections one renew (or drop) call extends
TAKE_CHUNK = 100  # close requests taken per call

Op = Generator[Any, Any, Any]


def registry_prefix(namespace: str) -> str:
    """All registry keys share one hash tag (a Redis Cluster routes the script to one node)."""
    return f"{namespace}:{{conns}}"


@dataclass
class ConnectionRecord:
    """One connection as its process knows it; `delta()` gives what the registry does not have yet."""

    connection_id: str
    protocol: str
    process: str
    user: str = ""
    client_id: str = ""
    address: str = ""
    since_ms: int = 0
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    producers: dict[str, list[int]] = field(default_factory=dict)  # destination -> [count, last send ms]
    producers_untracked: int = 0
    # what the registry holds, so deltas stay small
    _written_subs: set[str] = field(default_factory=set)
    _dirty_subs: set[str] = field(default_factory=set)
    _dirty_producers: set[str] = field(default_factory=set)
    _written_dests: dict[str, str] = field(default_factory=dict)
    _fields_dirty: bool = True
    registered: bool = False

    def subscribed(self, key: str, destinations: Iterable[str], *, ack_mode: str, selector: str | None = None,
                   prefetch: int | None = None, consumer_ids: Iterable[str] = (),
                   durable: str | None = None) -> None:
        self.subscriptions[key] = {
            "key": key, "destinations": list(destinations), "ack_mode": ack_mode, "selector": selector,
            "prefetch": prefetch, "consumers": list(consumer_ids), "durable": durable}
        self._dirty_subs.add(key)

    def unsubscribed(self, key: str) -> None:
        if self.subscriptions.pop(key, None) is not None:
            self._dirty_subs.add(key)

    def sent(self, destination: str, count: int, now_ms: int) -> bool:
        """Count sends; True when the destination is new to this record (worth writing at once)."""
        entry = self.producers.get(destination)
        if entry is None:
            if len(self.producers) >= PRODUCER_LIMIT:
                self.producers_untracked += count
                self._fields_dirty = True
                return False
            self.producers[destination] = [count, now_ms]
            self._dirty_producers.add(destination)
            return True
        entry[0] += count
        entry[1] = now_ms
        self._dirty_producers.add(destination)
        return False

    @property
    def dirty(self) -> bool:
        return bool(self._fields_dirty or self._dirty_subs or self._dirty_producers or not self.registered)

    def _dests(self) -> dict[str, str]:
        roles: dict[str, str] = {}
        for sub in self.subscriptions.values():
            for dest in sub["destinations"]:
                roles[dest] = "s"
        for dest in self.producers:
            roles[dest] = roles.get(dest, "") + "p"
        return roles

    def fields(self) -> dict[str, str]:
        return {"protocol": self.protocol, "process": self.process, "user": self.user,
                "client": self.client_id, "address": self.address, "since": str(self.since_ms),
                "producers_untracked": str(self.producers_untracked)}

    def delta(self, full: bool = False) -> dict[str, Any]:
        """What `put` writes: everything (`full`, or never written) or what changed; marks it written."""
        full = full or not self.registered
        if full:
            self._written_subs, self._written_dests = set(), {}
        subs = set(self.subscriptions) if full else self._dirty_subs
        prods = set(self.producers) if full else self._dirty_producers
        dests = self._dests()
        out: dict[str, Any] = {
            "set": self.fields() if full or self._fields_dirty else {},
            "sub_set": {k: json.dumps(self.subscriptions[k]) for k in subs if k in self.subscriptions},
            "sub_del": [k for k in subs if k not in self.subscriptions and k in self._written_subs],
            "prod_set": {d: f"{self.producers[d][0]}|{self.producers[d][1]}" for d in prods},
            "dest_set": {d: r for d, r in dests.items() if self._written_dests.get(d) != r},
            "dest_del": [d for d in self._written_dests if d not in dests],
        }
        self._written_subs = set(self.subscriptions)
        self._written_dests = dests
        self._dirty_subs, self._dirty_producers = set(), set()
        self._fields_dirty = False
        return out


@dataclass(frozen=True)
class ConnectionInfo:
    """A registered connection as the registry gives it back."""

    connection_id: str
    protocol: str
    process: str
    user: str
    client_id: str
    address: str
    since_ms: int
    subscription_count: int
    producer_count: int
    producers_untracked: int = 0
    close_requested_ms: int | None = None
    subscriptions: tuple[dict[str, Any], ...] = ()
    producers: tuple[dict[str, Any], ...] = ()
    destination_names: tuple[str, ...] = ()  # in a list page asked `with_destinations`

    @property
    def destinations(self) -> set[str]:
        """Every destination the connection subscribes to or sent to (a detail, or a list page asked
        `with_destinations`)."""
        names = {d for sub in self.subscriptions for d in sub["destinations"]}
        return names | {p["destination"] for p in self.producers} | set(self.destination_names)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.connection_id, "protocol": self.protocol, "process": self.process, "user": self.user,
            "client_id": self.client_id or None, "address": self.address or None,
            "connected_since": self.since_ms, "subscription_count": self.subscription_count,
            "producer_count": self.producer_count, "producers_untracked": self.producers_untracked,
            "close_requested": self.close_requested_ms}
        return data


def _info(entry: calls.ConnectionEntry) -> ConnectionInfo:
    f = entry.fields
    subscriptions = [json.loads(text) for text in entry.subscriptions.values()]
    producers: list[dict[str, Any]] = []
    for destination, text in entry.producers.items():
        count, _, last = text.partition("|")
        producers.append({"destination": destination, "count": int(count), "last_send": int(last)})
    subscriptions.sort(key=lambda s: s["key"])
    producers.sort(key=lambda p: p["destination"])
    requested = f.get("close_requested")
    return ConnectionInfo(
        connection_id=entry.connection_id, protocol=f.get("protocol", ""), process=f.get("process", ""),
        user=f.get("user", ""), client_id=f.get("client", ""), address=f.get("address", ""),
        since_ms=int(f.get("since") or 0), subscription_count=entry.subscription_count,
        producer_count=entry.producer_count, producers_untracked=int(f.get("producers_untracked") or 0),
        close_requested_ms=int(requested) if requested else None,
        subscriptions=tuple(subscriptions), producers=tuple(producers))


def put(namespace: str, record: ConnectionRecord, now_ms: int, *, lease_ms: int = DEFAULT_LEASE_MS,
        limit: int = DEFAULT_LIMIT, full: bool = False) -> Op:
    """Register the connection (first call) or write what changed. ConnectionRegistryFull when a new
    connection would pass `limit`. A record whose entry lapsed meanwhile is written again whole."""
    create = not record.registered
    payload = {"id": record.connection_id, "lease": lease_ms, "limit": limit, "create": create,
               **record.delta(full)}
    prefix = registry_prefix(namespace)
    if not calls.Connections.parse_put((yield calls.Connections.put(prefix, now_ms, payload))):
        record.registered = False  # lapsed: write it whole, as a new connection
        payload = {"id": record.connection_id, "lease": lease_ms, "limit": limit, "create": True,
                   **record.delta(True)}
        yield calls.Connections.put(prefix, now_ms, payload)
    record.registered = True
    return record


PUT_CHUNK = 50  # records one MULTI/EXEC of put_many writes


def put_many(namespace: str, records: list[ConnectionRecord], now_ms: int, *,
             lease_ms: int = DEFAULT_LEASE_MS, limit: int = DEFAULT_LIMIT) -> Op:
    """`put` for many records, PUT_CHUNK per MULTI/EXEC (a process's periodic write of its connections'
    counts: one round trip per chunk, not per connection). A record whose write failed (ConnectionRegistryFull
    for one that lapsed and finds the registry full) is left unregistered, to be tried again whole."""
    failed: list[ConnectionRecord] = []
    prefix = registry_prefix(namespace)
    for i in range(0, len(records), PUT_CHUNK):
        chunk = records[i:i + PUT_CHUNK]
        puts, again = [], []
        for record in chunk:
            payload = {"id": record.connection_id, "lease": lease_ms, "limit": limit,
                       "create": not record.registered, **record.delta()}
            puts.append(calls.Connections.put(prefix, now_ms, payload))
        replies = yield puts
        for record, reply in zip(chunk, replies, strict=True):
            if isinstance(reply, Exception):
                record.registered = False
                failed.append(record)
            elif not calls.Connections.parse_put(reply):  # lapsed: write it whole, as a new connection
                record.registered = False
                again.append(record)
            else:
                record.registered = True
        if again:
            puts = [calls.Connections.put(prefix, now_ms, {
                "id": r.connection_id, "lease": lease_ms, "limit": limit, "create": True, **r.delta(True)})
                for r in again]
            replies = yield puts
            for record, reply in zip(again, replies, strict=True):
                record.registered = not isinstance(reply, Exception)
                if not record.registered:
                    failed.append(record)
    return failed


def renew(namespace: str, connection_ids: list[str], now_ms: int, lease_ms: int = DEFAULT_LEASE_MS) -> Op:
    """Extend the leases of these connections (chunks of RENEW_CHUNK per call); returns the ids the
    registry no longer has (their lease lapsed: the caller writes them again whole)."""
    missing: list[str] = []
    for i in range(0, len(connection_ids), RENEW_CHUNK):
        chunk = connection_ids[i:i + RENEW_CHUNK]
        missing += calls.Connections.parse_renew(
            (yield calls.Connections.renew(registry_prefix(namespace), now_ms, lease_ms, chunk)))
    return missing


def drop(namespace: str, connection_ids: list[str], now_ms: int) -> Op:
    """Unregister; returns how many were registered."""
    n = 0
    for i in range(0, len(connection_ids), RENEW_CHUNK):
        n += calls.Connections.parse_drop((yield calls.Connections.drop(
            registry_prefix(namespace), now_ms, connection_ids[i:i + RENEW_CHUNK])))
    return n


@dataclass(frozen=True)
class Page:
    items: list[ConnectionInfo]
    cursor: str  # '' when the listing is done
    examined: int


FILTERS = ("protocol", "user", "client", "destination", "process")


def list_page(namespace: str, now_ms: int, cursor: str = "", count: int = 100,
              filters: dict[str, str] | None = None, with_destinations: bool = False) -> Op:
    """One page: examines at most `count` ids (≤ LIST_MAX) from `cursor` on, in id order, and returns those
    that match `filters` (protocol, user and process exact, client a substring of the client id or the
    connection id, destination a URI the connection subscribes or sent to)."""
    count = max(1, min(int(count), LIST_MAX))
    wanted: dict[str, Any] = {k: v for k, v in (filters or {}).items() if k in FILTERS and v}
    if with_destinations:
        wanted["with_destinations"] = True
    page = calls.Connections.parse_list_page(
        (yield calls.Connections.list_page(registry_prefix(namespace), now_ms, cursor, count, wanted)))
    items = []
    for entry in page.entries:
        info = _info(entry)
        if with_destinations:
            info = dataclasses.replace(info, destination_names=tuple(sorted(entry.destinations)))
        items.append(info)
    return Page(items, page.cursor, page.examined)


def get(namespace: str, connection_id: str, now_ms: int) -> Op:
    """The connection with its subscriptions and producers, or None."""
    entry = calls.Connections.parse_get(
        (yield calls.Connections.get(registry_prefix(namespace), now_ms, connection_id)), connection_id)
    return None if entry is None else _info(entry)


def live(namespace: str, connection_id: str, now_ms: int) -> Op:
    """Whether the connection is registered with a lease that has not lapsed: the owner of a temporary
    destination still lives (a process killed stops renewing; docs/broker_core.md "Temporary
    destinations"). One ZSCORE."""
    return lease_live((yield Command(("ZSCORE", lease_key(namespace), connection_id))), now_ms)


def counts(namespace: str, now_ms: int) -> Op:
    """(connections registered now with a live lease, connections registered since the registry began):
    ActiveMQ's CurrentConnectionsCount and TotalConnectionsCount. A ZCOUNT (O(log n)) and a GET."""
    live_now, total = yield [("ZCOUNT", lease_key(namespace), f"({now_ms}", "+inf"),
                             ("GET", f"{registry_prefix(namespace)}:total")]
    return int(live_now), int(total or 0)


def lease_key(namespace: str) -> str:
    """The registry's sorted set of connection id -> lease expiry (ms)."""
    return f"{registry_prefix(namespace)}:lease"


def lease_live(expires: Any, now_ms: int) -> bool:
    """Whether a lease expiry read from `lease_key` (None: not registered) is still ahead of now."""
    return expires is not None and float(expires) > now_ms


def request_close(namespace: str, connection_id: str, reason: str, now_ms: int) -> Op:
    """Ask the owning process to close the connection (it takes the request within its poll period);
    returns (process, protocol), or None when no such connection is registered."""
    return calls.Connections.parse_close(
        (yield calls.Connections.close(registry_prefix(namespace), now_ms, connection_id, reason)))


def take_closes(namespace: str, process: str, now_ms: int) -> Op:
    """(connection id, reason) of the connections this process was asked to close (each handed out once)."""
    return calls.Connections.parse_take(
        (yield calls.Connections.take(registry_prefix(namespace), now_ms, process, TAKE_CHUNK)))
