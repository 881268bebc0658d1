"""Rate history: what each destination did per second over the last hour (5 s steps) and day (1 min steps),
kept in Redis so a chart opened now shows the past (docs/broker_core.md "Rate history").

The maintenance tick samples (`sample_due`): one pass over the registry per 5 s epoch, in script calls of
SAMPLE_CHUNK destinations, until the call that passes TICK_SECONDS in a tick (a pass that does not fit goes
on at the next tick from where it stopped: its ZSCAN cursor, the rest of its page, a topic's
subscriptions). `rate_sample.lua` reads each destination's cumulative counters and adds what moved since
its previous sample to its rings; a ring is a string of fixed 32-byte slots (epoch, span, one delta per
series), so memory per destination is bounded (RING_BYTES) and a destination idle for
KEEP_MS has none. The first sample of a destination only sets the base (no spike on load); a counter
that went down (the destination made again) sets a new base; a sample after a stop (the worker was down)
covers the whole stop and is read as its average over it. The namespace's own rings sum every
destination's deltas (the overview).

Rates only: operator operations (purge, move) are not series; the console marks them from the audit log.
"""

from __future__ import annotations

import json
import struct
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .broker import Broker
from .destinations import Destination, parse_destination
from .effects import Command, Eval, Op
from .errors import InvalidDestination
from .resp import reply_text as _text
from .scripts import calls

SERIES = ("enqueued", "dispatched", "acked", "redelivered", "expired", "deadlettered", "discarded")
# A ring's slot holds the first six series (its layout since the history began); a series added since has
# a ring of its own beside it, "<ring>:<series>", of 8-byte slots (epoch, delta; the span is the main
# slot's), so history stored before it was added reads as it was written (rate_sample.lua too).
SLOTTED = SERIES[:6]
ADDED = SERIES[6:]
RINGS = {"5s": (5_000, 720), "1m": (60_000, 1_440)}  # name: (resolution ms, slots); rate_sample.lua too
SLOT = 8 + 4 * len(SLOTTED)
ADDED_SLOT = 8
# per destination: 69,120 + 17,280 for `discarded`
RING_BYTES = sum((SLOT + ADDED_SLOT * len(ADDED)) * size for _, size in RINGS.values())
RANGES = {"5m": ("5s", 300_000), "1h": ("5s", 3_600_000), "24h": ("1m", 86_400_000)}
KEEP_MS = 25 * 3_600_000  # a destination's rings and base go after this long without a sample
# destinations per script call: about 10 commands each; 50 took up to 14 ms at load average 15 on 2 cores
SAMPLE_CHUNK = 25
# subscriptions whose counters a call reads at most (one HMGET each): a topic with more is read over several
# calls of the pass, from where the previous one stopped (rate_sample.lua), so its rates count every
# subscription, as its stats do; 500 is what 5 topics of 100 read a call when a topic read its first 100
SUBS_PER_CALL = 500
SCAN_COUNT = 200
TICK_SECONDS = 0.5  # sampling time per tick; the rest of a pass is the next tick's
PASS_MS = 5_000  # a pass starts once per 5 s epoch
GAP_MS = 15_000  # a longer pass span is a stop of the sampler: the namespace's rings get no span for it
LEASE_MS = 10_000
_UNPACK = struct.Struct(f">{2 + len(SLOTTED)}I")
_UNPACK_ADDED = struct.Struct(">2I")


def _key(broker: Broker, dest: Destination | None) -> str:
    """The rate key of a destination (its base; its rings are <key>:5s and <key>:1m) or, for None, of the
    namespace."""
    return f"{broker.ops.prefix(dest)}:rates" if dest is not None else f"{broker.namespace}:rates"


def _sample_op(call: Eval) -> Op:
    return calls.RateSample.parse((yield call))


def sample(broker: Broker, destinations: Iterable[str | Destination], *, pass_span: int = 0) -> int:
    """Sample these destinations now (SAMPLE_CHUNK a call, at most SUBS_PER_CALL subscriptions read a call:
    a topic with more goes on in the next call); how many exist. `pass_span`: the ms the namespace's slot
    covers (the time since the previous pass began; 0 for a pass's further calls)."""
    dests = [d if isinstance(d, Destination) else parse_destination(d, allow_wildcards=True)
             for d in destinations]
    sampled, went_on = 0, calls.RateSampled(0, 0)
    while True:  # (at least one call, for the namespace's span)
        went_on = _sample_call(broker, dests, pass_span, went_on)
        sampled += went_on.sampled
        pass_span = 0
        dests = dests[went_on.done:]
        if not dests:
            return sampled


def _sample_call(broker: Broker, dests: list[Destination], pass_span: int,
                 went_on: calls.RateSampled) -> calls.RateSampled:
    """One rate_sample call over the first SAMPLE_CHUNK of `dests`, the first going on from where `went_on`
    (the previous call's reply) stopped in its subscriptions."""
    chunk = dests[:SAMPLE_CHUNK]
    return broker._run(_sample_op(calls.RateSample.call(
        _key(broker, None), [broker.ops.prefix(d) for d in chunk], broker.clock.now_ms(),
        "".join("t" if d.is_topic else "q" for d in chunk), pass_span, KEEP_MS, SUBS_PER_CALL,
        went_on.start, went_on.last, went_on.carry)))


def _registered(names: Iterable[Any]) -> list[Destination]:
    """The destinations of registry members; a name that is not one (written by hand) is left out: not ours
    to sample, the pass goes on."""
    dests = []
    for name in names:
        try:
            dests.append(parse_destination(name.decode() if isinstance(name, bytes) else name,
                                           allow_wildcards=True))
        except InvalidDestination:
            continue
    return dests


def sample_due(broker: Broker, seconds: float = TICK_SECONDS) -> int:
    """The tick's share of sampling: go on with the pass under way, or start one if this 5 s epoch has
    none yet; stop after the script call that passes `seconds`. One worker at a time (a lease). Returns how
    many were sampled.

    The pass's place is kept in the namespace's rate key between ticks: the registry's ZSCAN cursor, the
    rest of the page read last (`left`, its names) and, for a topic mid-way, where its subscriptions go on
    (`start`, `last`, `carry`, as the script replied). So a tick stops within one call of its share, where
    a check per registry page (up to SCAN_COUNT names, a topic's subscriptions over many calls each) let
    one page hold it for as long as that page took."""
    ns = _key(broker, None)
    token = uuid.uuid4().hex
    if not broker.redis.set(f"{ns}:lease", token, nx=True, px=LEASE_MS):
        return 0
    try:
        now = broker.clock.now_ms()
        pass_at, cursor, left, start, last, carry = broker.redis.hmget(
            ns, "pass_at", "cursor", "left", "start", "last", "carry")
        dests = _registered(json.loads(left)) if left else []
        went_on = calls.RateSampled(0, 0, int(start or 0), _text(last or b""), _text(carry or b""))
        cursor = int(cursor or 0)
        span, new_pass = 0, not cursor and not dests
        if new_pass:
            if pass_at is not None and now // PASS_MS == int(pass_at) // PASS_MS:
                return 0
            span = now - int(pass_at) if pass_at is not None else 0
            span = span if 0 < span <= GAP_MS else 0
            broker.redis.hset(ns, "pass_at", now)
        deadline = time.monotonic() + seconds
        sampled = 0
        while True:
            if not dests:
                if not cursor and not new_pass:  # the pass's last page is done
                    break
                new_pass = False
                cursor, page = broker.redis.zscan(broker.ops.registry_key, cursor, count=SCAN_COUNT)
                dests = _registered(member for member, _ in page)
            if dests or span:
                went_on = _sample_call(broker, dests, span, went_on)
                span = 0
                sampled += went_on.sampled
                dests = dests[went_on.done:]
            if time.monotonic() >= deadline:
                break
        if not dests:
            went_on = calls.RateSampled(0, 0)
        broker.redis.hset(ns, mapping={"cursor": int(cursor), "left": json.dumps([d.uri for d in dests]),
                                       "start": went_on.start, "last": went_on.last, "carry": went_on.carry})
        return sampled
    finally:
        if broker.redis.get(f"{ns}:lease") in (token, token.encode()):
            broker.redis.delete(f"{ns}:lease")


@dataclass(frozen=True)
class History:
    """Rates per second at each step of a range: `times` (ms, the start of each step), `rates` (series ->
    one value per step, None where nothing was sampled), what was sampled (`since_ms`, `until_ms`). A
    series added after the history began (ADDED) is None before it was first sampled."""

    range: str
    resolution_ms: int
    times: list[int]
    rates: dict[str, list[float | None]]
    since_ms: int | None
    until_ms: int | None


def history_op(broker: Any, dest: Destination | None, range_name: str, now: int) -> Op:
    """The History of a destination (None: the namespace, every destination summed) over `range_name`
    (RANGES) ending now. Two reads. For Broker._run or AsyncBroker._run."""
    ring, span = RANGES[range_name]
    key = _key(broker, dest)
    raw, *added = yield Command(("MGET", f"{key}:{ring}", *(f"{key}:{ring}:{name}" for name in ADDED)))
    since, until, added_since = yield Command(("HMGET", key, "since", "at", "xsince"))
    return decode(raw or b"", range_name, now, int(since) if since else None, int(until) if until else None,
                  dense=dest is None, added=[a or b"" for a in added],
                  added_since=int(added_since) if added_since else None)


def _slots(raw: bytes, added: list[bytes] | None = None) -> dict[int, tuple[int, tuple[int, ...]]]:
    """Epoch -> (span, one delta per series): the ring's slots, each with the added series' deltas of its
    epoch from their rings (0 where they have none: nothing of that series moved)."""
    extra: list[dict[int, int]] = []
    for ring in added or [b""] * len(ADDED):
        found: dict[int, int] = {}
        for offset in range(0, len(ring) - ADDED_SLOT + 1, ADDED_SLOT):
            epoch, delta = _UNPACK_ADDED.unpack_from(ring, offset)
            if epoch:
                found[epoch] = delta
        extra.append(found)
    out: dict[int, tuple[int, tuple[int, ...]]] = {}
    for offset in range(0, len(raw) - SLOT + 1, SLOT):
        epoch, span, *deltas = _UNPACK.unpack_from(raw, offset)
        if epoch:
            out[epoch] = (span, (*deltas, *(e.get(epoch, 0) for e in extra)))
    return out


def decode(raw: bytes, range_name: str, now: int, since: int | None, until: int | None, *,
           dense: bool = False, added: list[bytes] | None = None, added_since: int | None = None) -> History:
    """Rates from a ring. A step before the first sample or after the last is None. A step with no slot is
    0 for a destination's ring (nothing moved: idle samples are not written) and None for the namespace's
    (`dense`: every pass writes one), unless a later slot's span covers it (the sampler was late or
    stopped): then it gets that slot's average. A namespace slot of span 0 (a pass's later call in a new
    epoch) counts in the slot before it. The ADDED series (their rings: `added`) are None before
    `added_since`, when the sampler first read them for this key (history stored before they existed)."""
    ring, length = RANGES[range_name]
    res, _ = RINGS[ring]
    last = now // res
    first = last - length // res + 1
    slots = _slots(raw, added)
    for epoch in sorted(e for e, (s, _) in slots.items() if s == 0):
        _, deltas = slots.pop(epoch)
        before = max((e for e in slots if epoch - 2 <= e < epoch), default=None)
        if before is not None:
            span, kept = slots[before]
            slots[before] = (span, tuple(a + b for a, b in zip(kept, deltas, strict=True)))
    per_step: dict[int, tuple[float, ...]] = {}
    for epoch, (span, deltas) in slots.items():
        if first <= epoch <= last:
            per_step[epoch] = tuple(d * 1000 / span for d in deltas)
    for epoch in sorted(per_step, reverse=True):  # spread a long span over the steps it covers
        span = slots[epoch][0]
        k = epoch - 1
        while k > epoch - span / res and k not in slots and k >= first:
            per_step.setdefault(k, per_step[epoch])
            k -= 1
    times = [e * res for e in range(first, last + 1)]
    rates: dict[str, list[float | None]] = {name: [] for name in SERIES}
    for e in range(first, last + 1):
        known = since is not None and until is not None and (e + 1) * res > since and e * res <= until
        values = per_step.get(e) if known else None
        if values is None and known and not dense:
            values = (0.0,) * len(SERIES)
        new_known = added_since is not None and (e + 1) * res > added_since
        for i, name in enumerate(SERIES):
            absent = values is None or (i >= len(SLOTTED) and not new_known)
            rates[name].append(None if absent else round(values[i], 3))
    return History(range_name, res, times, rates, since, until)


def _parsed(destination: str | Destination | None) -> Destination | None:
    if isinstance(destination, str):
        return parse_destination(destination, allow_wildcards=True)
    return destination


def history(broker: Broker, destination: str | Destination | None, range_name: str = "1h",
            now: int | None = None) -> History:
    """The History ending `now` (the broker's clock when None); with an AsyncBroker, an awaitable."""
    now = broker.clock.now_ms() if now is None else now
    return broker._run(history_op(broker, _parsed(destination), range_name, now))


def ring_slots(broker: Broker, destination: str | Destination | None, ring: str) -> Iterator[int]:
    """The epochs a ring holds (tests, diagnostics)."""
    yield from sorted(_slots(broker.redis.get(f"{_key(broker, _parsed(destination))}:{ring}") or b""))
