"""gateway.permissions: ActiveMQ-style wildcard grants to users and groups, read / write / admin."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User

from broker_core.destinations import parse_destination
from broker_core.errors import InvalidDestination
from gateway.models import DestinationPermission
from gateway.permissions import allowed, allowed_async, readable_patterns, visible

pytestmark = pytest.mark.django_db(transaction=True)


def grant(pattern: str, *, read=False, write=False, admin=False, users=(),
          groups=()) -> DestinationPermission:
    rule = DestinationPermission.objects.create(destination=pattern, can_read=read, can_write=write,
                                                can_admin=admin)
    rule.users.set(users)
    rule.groups.set(groups)
    return rule


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="pw")


def test_no_rule_means_no_access(alice):
    assert not allowed(alice, "orders", "read")
    assert not allowed(alice, "orders", "write")


def test_anonymous_and_inactive_users_are_refused_even_with_a_grant(alice):
    grant(">", read=True, write=True, admin=True, users=[alice])
    assert not allowed(AnonymousUser(), "orders", "read")
    assert not allowed(None, "orders", "read")
    alice.is_active = False
    assert not allowed(alice, "orders", "read")


def test_superuser_may_do_everything():
    root = User.objects.create_superuser("root", password="pw")
    assert allowed(root, "topic://anything.at.all", "admin")


def test_exact_grant_is_per_action_and_per_kind(alice):
    grant("queue://orders", write=True, users=[alice])
    assert allowed(alice, "orders", "write")
    assert allowed(alice, "queue://orders", "write")
    assert not allowed(alice, "orders", "read")
    assert not allowed(alice, "topic://orders", "write")
    assert not allowed(alice, "orders.eu", "write")


def test_admin_implies_read_and_write(alice):
    grant("orders", admin=True, users=[alice])
    assert allowed(alice, "orders", "read") and allowed(alice, "orders", "write")


def test_wildcards_follow_activemq(alice):
    grant("orders.>", read=True, users=[alice])
    grant("prices.*.eur", write=True, users=[alice])
    assert allowed(alice, "orders", "read")  # `>` also matches the parent itself
    assert allowed(alice, "orders.eu.north", "read")
    assert not allowed(alice, "ordersx", "read")
    assert allowed(alice, "prices.spot.eur", "write")
    assert not allowed(alice, "prices.spot.usd", "write")
    assert not allowed(alice, "prices.eur", "write")


def test_a_wildcard_destination_needs_a_pattern_that_covers_it(alice):
    grant("orders.eu", read=True, users=[alice])
    assert not allowed(alice, "orders.>", "read")
    grant("orders.>", read=True, users=[alice])
    assert allowed(alice, "orders.*", "read")
    assert allowed(alice, "orders.>", "read")


def test_grants_to_a_group_reach_its_members_and_follow_membership(alice):
    ops = Group.objects.create(name="ops")
    grant("queue://>", read=True, groups=[ops])
    assert not allowed(alice, "orders", "read")
    alice.groups.add(ops)
    assert allowed(alice, "orders", "read")
    alice.groups.remove(ops)
    assert not allowed(alice, "orders", "read")


def test_grants_add_up_across_entries(alice):
    grant("orders.>", read=True, users=[alice])
    grant("orders.eu", write=True, users=[alice])
    assert allowed(alice, "orders.eu", "read") and allowed(alice, "orders.eu", "write")
    assert not allowed(alice, "orders.us", "write")


def test_a_composite_needs_every_part(alice):
    grant("a", write=True, users=[alice])
    grant("b", write=True, users=[alice])
    assert allowed(alice, "a,b", "write")
    assert not allowed(alice, "a,b,topic://c", "write")


def test_revoking_a_grant_takes_effect_at_once(alice):
    rule = grant("orders", read=True, users=[alice])
    assert allowed(alice, "orders", "read")
    rule.delete()
    assert not allowed(alice, "orders", "read")


def test_bad_names_and_actions_raise(alice):
    with pytest.raises(InvalidDestination):
        allowed(alice, "orders..eu", "read")
    with pytest.raises(ValueError, match="unknown action"):
        allowed(alice, "orders", "delete")  # type: ignore[arg-type]


def test_patterns_filter_listings(alice):
    grant("orders.>", read=True, users=[alice])
    patterns = readable_patterns(alice)
    assert visible(patterns, parse_destination("orders.eu"))
    assert not visible(patterns, parse_destination("billing"))
    assert readable_patterns(AnonymousUser()) == []


async def test_async_check_answers_like_the_blocking_one(alice):
    from tests.gateway_api.mixins import blocking

    await blocking(grant)("orders", read=True, users=[alice])
    assert await allowed_async(alice, "orders", "read")
    assert not await allowed_async(alice, "orders", "write")
