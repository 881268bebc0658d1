"""Per-destination permissions (read / write / admin with ActiveMQ wildcards, granted to users and
groups), shared by the REST API and the WebSocket/STOMP gateway.

    from gateway.permissions import allowed, allowed_async
    allowed(request.user, "queue://orders.eu", "write")          # -> bool
    await allowed_async(scope["user"], "topic://prices.>", "read")

Semantics (ActiveMQ's DefaultAuthorizationMap, spec §10.5 for the wildcards):
- every `DestinationPermission` whose pattern matches the destination counts; grants add up and
  nothing denies. `admin` implies `read` and `write`;
- a wildcard destination (a consumer on `orders.>`) is allowed only by a pattern that covers all of it
  (`orders.>` or `>`), never by one that matches only part of it (`orders.eu`);
- a composite (`A,B,topic://C`) needs the action on every part;
- superusers may do everything; anonymous and inactive users nothing.

The rules live in the database and are kept as one in-process snapshot, reloaded when a rule or a
group membership changes in this process (signals) and at most `SIGNALBOX_PERMISSION_CACHE_SECONDS`
(default 1 s) after a change made by another process. Checks on a fresh snapshot cost no query, so
the hot path (a send, a receive) stays off the database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from broker_core.destinations import Destination, covers, matches, parse_composite

Action = Literal["read", "write", "admin"]
ACTIONS: tuple[Action, ...] = ("read", "write", "admin")
DEFAULT_CACHE_SECONDS = 1.0
ANSWERS_KEPT = 10_000  # answers one snapshot remembers (`Rules.allows`); past that it starts again


@dataclass(frozen=True)
class Rule:
    """One authorization entry, as the checks use it."""

    pattern: Destination
    actions: frozenset[str]
    user_ids: frozenset[int]
    group_ids: frozenset[int]

    def grants(self, action: str) -> bool:
        return action in self.actions or "admin" in self.actions

    def applies_to(self, destination: Destination) -> bool:
        if destination.is_wildcard:
            return covers(self.pattern, destination)
        # A grant's pattern applies to a temporary destination by its name (`with_temporary`), as to the
        # ordinary queue or topic it is stored as: the REST API and the JSON protocol reach temporary
        # destinations through grants (a reply sent to one, an administrator's view); STOMP checks none
        # (ActiveMQ without a tempDestinationAuthorizationEntry). Routing patterns never match them.
        return matches(self.pattern, destination, with_temporary=True)


@dataclass(frozen=True)
class Rules:
    """A snapshot of every rule and of the memberships of the groups the rules name."""

    rules: tuple[Rule, ...]
    groups_of_user: dict[int, frozenset[int]]
    # `allows`'s answers: a connection asks the same question for every message it sends, and every rule
    # is looked at for it. A snapshot never changes, so neither do its answers; a change of the rules or
    # memberships makes a new snapshot, which starts with none.
    answers: dict[tuple[int, str, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def allows(self, user_id: int, destination: Destination, action: str) -> bool:
        key = (user_id, destination.uri, action)
        answer = self.answers.get(key)
        if answer is None:
            if len(self.answers) >= ANSWERS_KEPT:
                self.answers.clear()
            answer = self.answers[key] = self._allows(user_id, destination, action)
        return answer

    def _allows(self, user_id: int, destination: Destination, action: str) -> bool:
        groups = self.groups_of_user.get(user_id, frozenset())
        return any(
            rule.grants(action)
            and (user_id in rule.user_ids or not groups.isdisjoint(rule.group_ids))
            and rule.applies_to(destination)
            for rule in self.rules
        )

    def patterns_for(self, user_id: int, action: str) -> list[Destination]:
        """The patterns granting `action` to the user (to filter listings)."""
        groups = self.groups_of_user.get(user_id, frozenset())
        return [rule.pattern for rule in self.rules
                if rule.grants(action)
                and (user_id in rule.user_ids or not groups.isdisjoint(rule.group_ids))]


def load_rules() -> Rules:
    """Read the rules from the database (three queries)."""
    from django.contrib.auth import get_user_model

    from gateway.models import DestinationPermission

    rows = list(DestinationPermission.objects.prefetch_related("users", "groups"))
    rules = []
    referenced: set[int] = set()
    for row in rows:
        actions = frozenset(a for a in ACTIONS if getattr(row, f"can_{a}"))
        if not actions:
            continue
        group_ids = frozenset(g.pk for g in row.groups.all())
        referenced |= group_ids
        rules.append(Rule(_parse(row.destination)[0], actions, frozenset(u.pk for u in row.users.all()),
                          group_ids))
    memberships: dict[int, set[int]] = {}
    if referenced:
        through = get_user_model().groups.through
        for user_id, group_id in through.objects.filter(group_id__in=referenced).values_list(
                "user_id", "group_id"):
            memberships.setdefault(user_id, set()).add(group_id)
    return Rules(tuple(rules), {user: frozenset(groups) for user, groups in memberships.items()})


class _Cache:
    def __init__(self) -> None:
        self.rules: Rules | None = None
        self.loaded_at = 0.0
        self.generation = 0
        self.lock = threading.Lock()

    def ttl(self) -> float:
        from django.conf import settings

        return float(getattr(settings, "SIGNALBOX_PERMISSION_CACHE_SECONDS", DEFAULT_CACHE_SECONDS))

    def fresh(self) -> Rules | None:
        if self.rules is not None and time.monotonic() - self.loaded_at < self.ttl():
            return self.rules
        return None

    def get(self) -> Rules:
        rules = self.fresh()
        if rules is not None:
            return rules
        generation = self.generation
        loaded = load_rules()
        with self.lock:
            # An invalidation that arrived while we read must not be overwritten by older data.
            if generation == self.generation:
                self.rules, self.loaded_at = loaded, time.monotonic()
        return loaded

    def invalidate(self) -> None:
        with self.lock:
            self.generation += 1
            self.rules = None


_cache = _Cache()


def _reload_in_worker() -> Rules:
    """The snapshot, read in a worker thread that belongs to no request: close what it opened."""
    from django.db import close_old_connections

    try:
        return _cache.get()
    finally:
        close_old_connections()


def invalidate(*_args: Any, **_kwargs: Any) -> None:
    """Forget the snapshot (connected to the signals of the rule and membership tables)."""
    _cache.invalidate()


def _parse(destination: str | Destination) -> list[Destination]:
    if isinstance(destination, Destination):
        return [destination]
    return parse_composite(destination, allow_wildcards=True)


def _decide(user: Any, destination: str | Destination | Iterable[Destination], action: str,
            rules: Rules | None) -> bool | None:
    """The answer if it needs no rules (None: consult them). Raises for an unknown action."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", True):
        return False
    if getattr(user, "is_superuser", False):
        return True
    if rules is None:
        return None
    destinations = _targets(destination)
    return all(rules.allows(user.pk, d, action) for d in destinations)


def _targets(destination: str | Destination | Iterable[Destination]) -> list[Destination]:
    if isinstance(destination, str | Destination):
        return _parse(destination)
    return list(destination)


def allowed(user: Any, destination: str | Destination | Iterable[Destination], action: Action) -> bool:
    """May `user` do `action` ('read', 'write' or 'admin') on `destination`?

    `destination` is a Destination, a list of them, or text (`orders`, `queue://a.b`, `topic://x.>`,
    composites `A,B,topic://C`); text without a scheme is a queue. Raises
    broker_core.errors.InvalidDestination for a malformed name, ValueError for an unknown action.
    Blocking (it may read the rules from the database); in async code use `allowed_async`.
    """
    decided = _decide(user, destination, action, None)
    if decided is not None:
        return decided
    return bool(_decide(user, destination, action, _cache.get()))


def allowed_now(user: Any, destination: str | Destination | Iterable[Destination],
                action: Action) -> bool | None:
    """`allowed` when it needs no database: decided by the user alone or by a fresh snapshot; None when
    the snapshot must be read first (`allowed_async` does that in a thread). For the hot path of a
    socket, which checks every message it sends without waiting for anything."""
    decided = _decide(user, destination, action, None)
    if decided is not None:
        return decided
    rules = _cache.fresh()
    return None if rules is None else bool(_decide(user, destination, action, rules))


async def allowed_async(user: Any, destination: str | Destination | Iterable[Destination],
                        action: Action) -> bool:
    """`allowed` for async callers: answers inline from a fresh snapshot, else reloads in a thread."""
    decided = allowed_now(user, destination, action)
    if decided is not None:
        return decided
    from asgiref.sync import sync_to_async

    rules = await sync_to_async(_reload_in_worker, thread_sensitive=False)()
    return bool(_decide(user, destination, action, rules))


def is_staff(user: Any) -> bool:
    """A staff user (or a superuser): an operator, who sees what is the broker's rather than one user's (the
    audit log, the node, every connection, a temporary destination's contents)."""
    return bool(getattr(user, "is_authenticated", False)
                and (getattr(user, "is_staff", False) or getattr(user, "is_superuser", False)))


def temporary_refusal(user: Any, destination: Destination, connection_id: str | None = None) -> str | None:
    """Why `user`, on connection `connection_id` (None: the REST API, which has none), may not see or take
    the contents of `destination` (its messages, its scheduled jobs); None when the rule below allows it
    or the destination is not temporary. A temporary destination's contents are its own connection's, as
    ActiveMQ refuses another connection's consumer or browser of one ("Cannot consume from a temporary
    destination created on another connection"; Router.add_consumer, Broker.browser_limit), and a staff
    user's: an operator looks, or takes messages out, where no connection could. A grant covering its name
    lets a user send a reply to it, not read the replies. The one rule of every adapter: the REST API's
    views (refuse_temporary_contents) and the scheduler management of the REST send and of the
    WebSocket/STOMP sessions (`contents_allowed`)."""
    owner = destination.temporary_owner
    if owner is None or owner == connection_id or is_staff(user):
        return None
    return (f"{destination.uri} is a temporary destination of connection {owner}: its messages are that "
            "connection's; only a staff user may read them here")


async def contents_allowed(user: Any, destination: Destination, action: Action,
                           connection_id: str | None = None) -> bool:
    """May `user`, on connection `connection_id`, do `action` on the contents of `destination` (the
    scheduler management's jobs of it)? Its own connection's temporary destination needs no grant (STOMP
    checks none on temporary destinations, as ActiveMQ without a tempDestinationAuthorizationEntry);
    anything else needs the grant, and a temporary destination of another connection a staff user too
    (`temporary_refusal`), as the REST API's views ask both."""
    if connection_id is not None and destination.temporary_owner == connection_id:
        return True
    if temporary_refusal(user, destination, connection_id) is not None:
        return False
    return await allowed_async(user, destination, action)


async def reply_to_refusal(user: Any, reply_to: Destination, *, temporary_checked: bool = True) -> str | None:
    """Why `user` may not have a scheduler management BROWSE send its jobs to `reply_to`; None when it may.
    A BROWSE's replies are sends there, so it needs the right to write there as a send does (ActiveMQ's
    SchedulerBroker sends them below its authorization and checks nothing: without this a user could put
    messages where it may not write). `temporary_checked=False`: the adapter's sends check no temporary
    destination (STOMP, as ActiveMQ without a tempDestinationAuthorizationEntry), so neither does this. The
    one rule of every adapter: the REST send (gateway/api/views_messaging.py manage_scheduler) and the
    STOMP and JSON sessions (gateway/ws/session.py LinkedSession.manage_scheduler)."""
    if (not temporary_checked and reply_to.is_temporary) or await allowed_async(user, reply_to, "write"):
        return None
    name = user.get_username() if hasattr(user, "get_username") else ""
    return (f"User {name} is not authorized to write to: {reply_to.uri} (the BROWSE's reply-to, where its "
            "jobs go)")


def readable_patterns(user: Any, action: Action = "read") -> list[Destination] | None:
    """Patterns under which `user` may do `action`; None means everything (superuser). Blocking."""
    decided = _decide(user, ">", action, None)
    if decided is True:
        return None
    if decided is False:
        return []
    return _cache.get().patterns_for(user.pk, action)


def visible(patterns: list[Destination] | None, destination: Destination) -> bool:
    """Whether a destination falls under the patterns from `readable_patterns`."""
    return patterns is None or any(matches(p, destination, with_temporary=True) for p in patterns)


def connect_signals() -> None:
    """Reload the snapshot when rules or memberships change (called from GatewayConfig.ready)."""
    from django.contrib.auth import get_user_model
    from django.db.models.signals import m2m_changed, post_delete, post_save

    from gateway.models import DestinationPermission

    post_save.connect(invalidate, sender=DestinationPermission, dispatch_uid="gateway-perm-save")
    post_delete.connect(invalidate, sender=DestinationPermission, dispatch_uid="gateway-perm-delete")
    m2m_changed.connect(invalidate, sender=DestinationPermission.users.through, dispatch_uid="gateway-perm-u")
    m2m_changed.connect(invalidate, sender=DestinationPermission.groups.through,
                        dispatch_uid="gateway-perm-g")
    m2m_changed.connect(invalidate, sender=get_user_model().groups.through, dispatch_uid="gateway-perm-m")
    from django.contrib.auth.models import Group

    post_delete.connect(invalidate, sender=Group, dispatch_uid="gateway-perm-group-delete")
    post_delete.connect(invalidate, sender=get_user_model(), dispatch_uid="gateway-perm-user-delete")
