"""Destination policies: defaults, validation, resolution, prefetch, TOML files and the Redis store
(spec §13, §10.5, §1.5, §3.1, §5.3, §5.4)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import broker_core.config.entry as policy_module
from broker_core.config.entry import (
    ATTRIBUTE_NAMES,
    CLASS_DEFAULTS,
    PolicyEntry,
    effective_prefetch,
    normalize_attributes,
)
from broker_core.config.policy_map import PolicyMap, PolicyMapEntry, load_policy_file
from broker_core.config.store import PolicyStore
from broker_core.destinations import Destination, parse_destination
from broker_core.errors import InvalidConsumer, InvalidDestination, InvalidPolicy

EXAMPLE_FILE = Path(__file__).resolve().parents[3] / "signalbox.example.toml"


def q(name: str) -> Destination:
    return Destination("queue", name)


def t(name: str) -> Destination:
    return Destination("topic", name)


def policy_map(*entries: tuple[str, str, dict], default: dict | None = None) -> PolicyMap:
    return PolicyMap([PolicyMapEntry.create(*entry) for entry in entries], default)


# -- defaults


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        # §13
        ("producerFlowControl", True),
        ("memoryLimit", 0),
        ("storeUsageHighWaterMark", 100),
        ("sendFailIfNoSpace", None),
        ("sendFailIfNoSpaceAfterTimeout", -1),
        ("blockedProducerWarningInterval", 30000),
        ("maxPageSize", 200),
        ("maxBrowsePageSize", 400),
        ("maxExpirePageSize", 400),
        ("expireMessagesPeriod", 30000),
        ("minimumMessageSize", 1024),
        ("useConsumerPriority", True),
        ("strictOrderDispatch", False),
        ("prioritizedMessages", False),
        ("allConsumersExclusiveByDefault", False),
        ("consumersBeforeDispatchStarts", 0),
        ("timeBeforeDispatchStarts", 0),
        ("messageGroupMapFactoryType", "cached"),
        ("queuePrefetch", 1000),
        ("queueBrowserPrefetch", 500),
        ("topicPrefetch", 32767),
        ("durableTopicPrefetch", 100),
        ("usePrefetchExtension", True),
        ("enableAudit", True),
        ("maxQueueAuditDepth", 10000),
        ("maxAuditDepth", 10000),
        ("maxProducersToAudit", 64),
        ("dispatchPolicy", "simple"),
        ("subscriptionRecoveryPolicy", "retainedMessage"),
        ("alwaysRetroactive", False),
        ("pendingMessageLimitStrategy", "none"),
        ("messageEvictionStrategy", "oldestMessage"),
        ("evictExpiredMessagesHighWatermark", 1000),
        ("slowConsumerStrategy", "none"),
        ("advisoryForSlowConsumers", False),
        ("advisoryWhenFull", False),
        ("sendAdvisoryIfNoConsumers", False),
        ("gcInactiveDestinations", False),
        ("inactiveTimeoutBeforeGC", 60000),
        ("maxDestinations", -1),
        # §3.1
        ("groupMapCacheSize", 1024),
        ("groupMapBucketCount", 0),
        # §5.3
        ("maximumRedeliveries", 6),
        ("initialRedeliveryDelay", 1000),
        ("redeliveryDelay", 1000),
        ("useExponentialBackOff", False),
        ("backOffMultiplier", 5.0),
        ("maximumRedeliveryDelay", -1),
        ("useCollisionAvoidance", False),
        # §5.4
        ("deadLetterStrategy", "shared"),
        ("deadLetterQueue", "ActiveMQ.DLQ"),
        ("queuePrefix", "ActiveMQ.DLQ.Queue."),
        ("topicPrefix", "ActiveMQ.DLQ.Topic."),
        ("queueSuffix", ""),
        ("useQueueForQueueMessages", True),
        ("useQueueForTopicMessages", True),
        ("destinationPerDurableSubscriber", False),
        ("processExpired", True),
        ("processNonPersistent", False),
        ("deadLetterExpiration", 0),
        ("deadLetterEnableAudit", True),
        # §8.2, §8.3
        ("checkPeriod", 30000),
        ("maxSlowDuration", 30000),
        ("maxSlowCount", -1),
        ("abortConnection", False),
        ("maxTimeSinceLastAck", 30000),
        ("ignoreIdleConsumers", True),
        # §7.4, §7.5, §8.5
        ("offlineDurableSubscriberTimeout", -1),
        ("offlineDurableSubscriberTaskSchedule", 300000),
        ("subscriptionRecoveryMaximumSize", 0),
        ("recoverDuration", 60000),
        ("pendingMessageLimit", -1),
        ("pendingMessageLimitMultiplier", 0.5),
        # Signalbox's own
        ("maxMessageSize", 1024 * 1024),
        ("maxPropertyCount", 256),
        ("eventsMaxLen", 100000),
    ],
)
def test_policy_entry_defaults_are_activemqs(attribute, expected):
    assert PolicyEntry().to_attributes()[attribute] == expected


def test_class_defaults_differ_from_an_empty_entry_only_where_activemq_does():
    empty, none = PolicyEntry().to_redis_hash(), CLASS_DEFAULTS.to_redis_hash()
    different = {name for name in empty if empty[name] != none[name]}
    assert different == {
        "maxQueueAuditDepth", "maxProducersToAudit", "topicSubscriptionAudit", "policyApplied"
    }
    assert (none["maxQueueAuditDepth"], none["maxProducersToAudit"]) == ("2048", "1024")
    assert none["topicSubscriptionAudit"] == "0"  # TopicSubscription keeps no audit without a policy
    assert empty["topicSubscriptionAudit"] == "1"


@pytest.mark.parametrize(
    ("group_map", "expected"),
    [
        ("cached", ("cached", "1024", "0")),
        ("simple", ("simple", "0", "0")),
        ("bucket", ("bucket", "64", "1024")),
        ("cached?cacheSize=2", ("cached", "2", "0")),
        ("bucket?bucketCount=256", ("bucket", "64", "256")),
        ("bucket?bucketCount=16&cacheSize=8", ("bucket", "8", "16")),
        ("messageGroupHashBucketFactory", ("bucket", "64", "1024")),
        ("cachedMessageGroupMapFactory?cacheSize=10", ("cached", "10", "0")),
    ],
)
def test_group_map_sizes_default_by_type_and_accept_activemqs_query_form(group_map, expected):
    stored = PolicyEntry.from_attributes({"messageGroupMapFactoryType": group_map}).to_redis_hash()
    names = ("messageGroupMapFactoryType", "groupMapCacheSize", "groupMapBucketCount")
    assert tuple(stored[name] for name in names) == expected


def test_group_map_properties_can_also_be_given_as_attributes():
    entry = PolicyEntry.from_attributes({"messageGroupMapFactoryType": "bucket", "groupMapBucketCount": 8})
    assert (entry.group_map_bucket_count, entry.group_map_cache_size) == (8, 64)
    same = PolicyEntry.from_attributes(
        {"messageGroupMapFactoryType": "bucket?bucketCount=8", "groupMapBucketCount": 8}
    )
    assert same == entry


def test_python_construction_fills_type_defaults_too():
    entry = PolicyEntry(message_group_map_factory_type="bucket", subscription_recovery_policy="fixedSized")
    assert (entry.group_map_cache_size, entry.group_map_bucket_count) == (64, 1024)
    assert entry.subscription_recovery_maximum_size == 65536
    assert PolicyEntry(subscription_recovery_policy="fixedCount").subscription_recovery_maximum_size == 100


def test_strategy_types_accept_activemq_element_names():
    entry = PolicyEntry.from_attributes(
        {
            "deadLetterStrategy": (
                "individualDeadLetterStrategy?queuePrefix=DLQ.&useQueueForTopicMessages=false"
            ),
            "slowConsumerStrategy": "abortSlowAckConsumerStrategy?maxTimeSinceLastAck=5000",
            "pendingMessageLimitStrategy": "constantPendingMessageLimitStrategy?limit=1000",
            "subscriptionRecoveryPolicy": "noSubscriptionRecoveryPolicy",
            "dispatchPolicy": "roundRobinDispatchPolicy",
        }
    )
    assert entry.dead_letter_strategy == "individual"
    assert (entry.queue_prefix, entry.use_queue_for_topic_messages) == ("DLQ.", False)
    assert (entry.slow_consumer_strategy, entry.max_time_since_last_ack) == ("abortSlowAckConsumer", 5000)
    assert (entry.pending_message_limit_strategy, entry.pending_message_limit) == ("constant", 1000)
    assert entry.subscription_recovery_policy == "none"
    assert entry.dispatch_policy == "roundRobin"


# -- validation


@pytest.mark.parametrize(
    ("attributes", "complaint"),
    [
        ({"queuePrefetch": -1}, "queuePrefetch must be an integer between 0 and 32767, got -1"),
        ({"topicPrefetch": 40000}, "topicPrefetch must be an integer between 0 and 32767, got 40000"),
        ({"queuePrefetch": "10"}, "queuePrefetch must be an integer, got '10'"),
        ({"queuePrefetch": 1.5}, "queuePrefetch must be an integer, got 1.5"),
        ({"producerFlowControl": 1}, "producerFlowControl must be a boolean (true or false), got 1"),
        ({"maxPageSize": 0}, "maxPageSize must be an integer between 1 and 10000, got 0"),
        ({"maximumRedeliveries": -2}, "maximumRedeliveries must be an integer >= -1, got -2"),
        ({"maxDestinations": 0}, "maxDestinations must be -1 (off) or an integer >= 1, got 0"),
        ({"backOffMultiplier": 0.5}, "backOffMultiplier must be a number >= 1, got 0.5"),
        ({"backOffMultiplier": float("nan")}, "backOffMultiplier must be a finite number"),
        ({"backOffMultiplier": True}, "backOffMultiplier must be a finite number, got True"),
        ({"maxMessageSize": 0}, "maxMessageSize must be an integer between 1 and 536870912, got 0"),
        ({"dispatchPolicy": "fair"}, "dispatchPolicy must be one of 'simple', 'roundRobin'"),
        ({"messageGroupMapFactoryType": "buckets"}, "did you mean 'bucket'?"),
        ({"messageGroupMapFactoryType": "cached?size=5"}, "has no property 'size' (it takes cacheSize)"),
        ({"messageGroupMapFactoryType": "simple?cacheSize=5"}, "'simple' has no property 'cacheSize'"),
        ({"messageGroupMapFactoryType": "cached?cacheSize"}, "expected prop=value, got 'cacheSize'"),
        ({"messageGroupMapFactoryType": "cached?cacheSize=x"}, "'x' is not an integer (for groupMapCache"),
        ({"messageGroupMapFactoryType": "cached?cacheSize=0"}, "groupMapCacheSize must be an integer >= 1"),
        (
            {"messageGroupMapFactoryType": "bucket?bucketCount=2", "groupMapBucketCount": 3},
            "groupMapBucketCount is set to 3 and to 2",
        ),
        ({"groupMapBucketCount": 16}, "applies only when messageGroupMapFactoryType is 'bucket'"),
        ({"queuePrefix": "DLQ."}, "queuePrefix applies only when deadLetterStrategy is 'individual'"),
        (
            {"deadLetterStrategy": "discarding", "processExpired": False},
            "processExpired applies only when deadLetterStrategy is 'shared' or 'individual'",
        ),
        ({"maxTimeSinceLastAck": 1}, "applies only when slowConsumerStrategy is 'abortSlowAckConsumer'"),
        ({"pendingMessageLimit": 10}, "applies only when pendingMessageLimitStrategy is 'constant'"),
        ({"deadLetterQueue": "my dlq"}, "deadLetterQueue must be a queue name without a scheme"),
        ({"deadLetterQueue": "topic://x"}, "deadLetterQueue must be a queue name without a scheme"),
        (
            {"deadLetterStrategy": "individual", "queuePrefix": "DLQ{"},
            "queuePrefix 'DLQ{' would give invalid destination names",
        ),
        ({"messageEvictionStrategy": "uniquePropertyMessage"}, "needs evictionPropertyName"),
        ({"sendFailIfNoSpace": "yes"}, "sendFailIfNoSpace must be a boolean"),
    ],
)
def test_bad_attributes_name_the_attribute_and_the_value(attributes, complaint):
    with pytest.raises(InvalidPolicy) as caught:
        PolicyEntry.from_attributes(attributes)
    assert complaint in caught.value.message
    assert caught.value.details.get("attribute")


@pytest.mark.parametrize(
    ("name", "complaint", "suggestion"),
    [
        ("prioritizeMessages", "did you mean 'prioritizedMessages'?", "prioritizedMessages"),
        ("maxPageInSize", "did you mean 'maxPageSize'?", "maxPageSize"),
        ("queueprefetch", "did you mean 'queuePrefetch'?", "queuePrefetch"),
        ("queue_prefetch", "use the camelCase name 'queuePrefetch'", "queuePrefetch"),
        ("zzz", "unknown policy attribute 'zzz'", None),
        ("queue", "'queue' names the entry's pattern, not an attribute", None),
    ],
)
def test_unknown_attributes_suggest_the_closest_known_name(name, complaint, suggestion):
    with pytest.raises(InvalidPolicy) as caught:
        PolicyEntry.from_attributes({name: 1})
    assert complaint in caught.value.message
    assert caught.value.details.get("suggestion") == suggestion


def test_activemq_attributes_without_meaning_here_say_why():
    with pytest.raises(InvalidPolicy, match="cursorMemoryHighWaterMark is not supported by Signalbox: there"):
        PolicyEntry.from_attributes({"cursorMemoryHighWaterMark": 70})


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 70000), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["cached", "bucket?bucketCount=3", "individual", "constant?limit=5", "DLQ."]),
)


@given(st.dictionaries(st.sampled_from(sorted(ATTRIBUTE_NAMES)), _values, max_size=6))
def test_any_attribute_mapping_gives_an_entry_or_invalid_policy(attributes):
    try:
        entry = PolicyEntry.from_attributes(attributes)
    except InvalidPolicy as error:
        assert error.message
    else:
        assert PolicyEntry.from_attributes(normalize_attributes(attributes)) == entry
        assert all(isinstance(v, str) for v in entry.to_redis_hash().values())


# -- names and the Redis hash


def test_attribute_names_are_one_mapping_between_camel_case_and_python():
    entry = PolicyEntry()
    assert set(ATTRIBUTE_NAMES.values()) == {
        name for name in vars(entry) if name not in ("applied", "origin")
    }
    assert ATTRIBUTE_NAMES["inactiveTimeoutBeforeGC"] == "inactive_timeout_before_gc"
    assert ATTRIBUTE_NAMES["useExponentialBackOff"] == "use_exponential_back_off"
    configured = PolicyEntry.from_attributes({"queuePrefetch": 7, "deadLetterStrategy": "individual"})
    assert configured.to_attributes()["queuePrefetch"] == configured.queue_prefetch == 7


def test_the_redis_hash_is_all_strings_under_camel_case_names():
    entry = PolicyEntry.from_attributes(
        {"prioritizedMessages": True, "backOffMultiplier": 2, "sendFailIfNoSpace": False},
        origin="queue://orders.>",
    )
    stored = entry.to_redis_hash()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in stored.items())
    assert stored["prioritizedMessages"] == "1"
    assert stored["strictOrderDispatch"] == "0"
    assert stored["queuePrefetch"] == "1000"
    assert stored["backOffMultiplier"] == "2.0"
    assert stored["pendingMessageLimitMultiplier"] == "0.5"
    assert stored["sendFailIfNoSpace"] == "0"
    assert PolicyEntry().to_redis_hash()["sendFailIfNoSpace"] == "-1"
    assert stored["messageGroupMapFactoryType"] == "cached"
    assert (stored["groupMapCacheSize"], stored["groupMapBucketCount"]) == ("1024", "0")
    assert (stored["policyApplied"], stored["policyOrigin"]) == ("1", "queue://orders.>")
    assert set(stored) == set(ATTRIBUTE_NAMES) | {"topicSubscriptionAudit", "policyApplied", "policyOrigin"}


def test_the_module_docstring_lists_every_redis_hash_name():
    documented = set(re.findall(r"\b[a-z][A-Za-z]+[A-Z][A-Za-z]*\b", policy_module.__doc__ or ""))
    missing = set(PolicyEntry().to_redis_hash()) - documented
    assert not missing


# -- resolution (§10.5)


def test_an_exact_name_entry_beats_every_pattern():
    m = policy_map(
        ("queue", ">", {"queuePrefetch": 1}),
        ("queue", "orders.*", {"queuePrefetch": 2}),
        ("queue", "orders.eu", {"queuePrefetch": 3}),
    )
    assert m.resolve(q("orders.eu")).queue_prefetch == 3
    assert m.resolve(q("orders.us")).queue_prefetch == 2
    assert m.resolve(q("billing")).queue_prefetch == 1


def test_the_most_specific_pattern_wins_whatever_the_order_of_entries():
    specs = [
        ("queue", ">", {"queuePrefetch": 1}),
        ("queue", "orders.>", {"queuePrefetch": 2}),
        ("queue", "orders.eu.>", {"queuePrefetch": 3}),
        ("queue", "*.us.*", {"queuePrefetch": 4}),
    ]
    for order in itertools.permutations(specs):
        m = policy_map(*order)
        assert m.resolve(q("orders.eu.de")).queue_prefetch == 3
        assert m.resolve(q("orders.eu")).queue_prefetch == 3  # orders.eu.> also matches orders.eu itself
        assert m.resolve(q("orders.us")).queue_prefetch == 2
        assert m.resolve(q("orders")).queue_prefetch == 2
        assert m.resolve(q("billing.us.x")).queue_prefetch == 4
        assert m.resolve(q("billing")).queue_prefetch == 1
        # orders.> and *.us.* both match and neither covers the other: '*' sorts before 'o'.
        assert m.resolve(q("orders.us.x")).queue_prefetch == 4


def test_attributes_of_less_specific_entries_are_not_merged():
    m = policy_map(
        ("queue", ">", {"prioritizedMessages": True, "maximumRedeliveries": 1}),
        ("queue", "orders.>", {"queuePrefetch": 10}),
    )
    entry = m.resolve(q("orders.eu"))
    assert entry.queue_prefetch == 10
    assert entry.prioritized_messages is False  # the PolicyEntry default, not the '>' entry's value
    assert entry.maximum_redeliveries == 6
    assert entry.origin == "queue://orders.>"


def test_patterns_that_do_not_cover_each_other_are_ranked_by_java_string_order():
    m = policy_map(("queue", "orders.*", {"queuePrefetch": 1}), ("queue", "*.eu", {"queuePrefetch": 2}))
    # Neither pattern covers the other; ActiveMQ then compares physical names and '*' < 'o'.
    assert m.resolve(q("orders.eu")).queue_prefetch == 2
    assert [e.pattern for e in m.matching_entries(q("orders.eu"))] == ["*.eu", "orders.*"]


def test_pattern_pairs_activemq_leaves_to_hash_order_resolve_to_the_narrower_one():
    m = policy_map(("queue", "*.>", {"queuePrefetch": 1}), ("queue", "orders.>", {"queuePrefetch": 2}))
    assert m.resolve(q("orders.eu")).queue_prefetch == 2
    m = policy_map(("queue", "a.>", {"queuePrefetch": 1}), ("queue", "a.*", {"queuePrefetch": 2}))
    assert m.resolve(q("a.b")).queue_prefetch == 2
    assert m.resolve(q("a")).queue_prefetch == 1


def test_queue_entries_never_apply_to_topics():
    m = policy_map(("queue", ">", {"queuePrefetch": 5}))
    assert m.resolve(t("orders")) is CLASS_DEFAULTS


def test_without_a_match_the_default_entry_applies_else_the_class_defaults():
    without = policy_map(("queue", "orders.>", {"queuePrefetch": 5}))
    assert without.resolve(q("billing")) is CLASS_DEFAULTS
    assert without.resolve(q("billing")).max_queue_audit_depth == 2048
    with_default = policy_map(("queue", "orders.>", {"queuePrefetch": 5}), default={"queuePrefetch": 9})
    fallback = with_default.resolve(t("billing"))
    assert (fallback.queue_prefetch, fallback.origin, fallback.applied) == (9, "default", True)
    assert fallback.max_queue_audit_depth == 10000  # an applied entry has PolicyEntry defaults
    assert with_default.resolve(q("orders.x")).queue_prefetch == 5


def test_matching_entries_lists_the_winner_first_then_the_rest_in_resolution_order():
    m = policy_map(
        ("queue", ">", {}), ("queue", "orders.>", {}), ("queue", "orders.eu", {}), ("queue", "x.>", {})
    )
    assert [e.id for e in m.matching_entries(q("orders.eu"))] == [
        "queue://orders.eu",
        "queue://orders.>",
        "queue://>",
    ]
    assert m.entry_for(q("nothing.here")).id == "queue://>"


def test_a_pattern_can_be_given_only_once():
    with pytest.raises(InvalidPolicy, match="two policy entries for queue://orders.>"):
        policy_map(("queue", "orders.>", {}), ("queue", "orders.>", {"queuePrefetch": 1}))


def test_with_entry_replaces_and_without_entry_removes():
    m = policy_map(("queue", "orders.>", {"queuePrefetch": 5}))
    changed = m.with_entry("queue", "orders.>", {"queuePrefetch": 6})
    assert changed.resolve(q("orders.a")).queue_prefetch == 6
    assert m.resolve(q("orders.a")).queue_prefetch == 5
    assert changed.without_entry("queue", "orders.>").resolve(q("orders.a")) is CLASS_DEFAULTS


def test_a_pattern_with_the_other_kinds_scheme_is_rejected():
    with pytest.raises(InvalidDestination, match="names a topic but the entry is for a queue"):
        PolicyMapEntry.create("queue", "topic://orders", {})


# -- prefetch (§1.5)


@pytest.mark.parametrize(
    ("kind", "requested", "expected"),
    [
        ("queue", None, 7),
        ("queue", 1000, 7),  # the client default: the policy replaces it
        ("queue", 10, 10),  # an explicit prefetch is never overridden
        ("queue", 0, 0),
        ("browser", None, 8),
        ("browser", 500, 8),
        ("browser", 1000, 1000),
        ("topic", None, 9),
        ("topic", 32767, 9),
        ("topic", 50000, 9),  # capped at 32767 like ActiveMQ's client, which is the topic default
        ("topic", 100, 100),
        ("durable", None, 11),
        ("durable", 100, 11),
        ("durable", 1000, 11),  # the optimize-acknowledge default counts as a default too
        ("durable", 5, 5),
        ("queue", 40000, 32767),
    ],
)
def test_policy_prefetch_applies_only_to_consumers_that_kept_the_client_default(kind, requested, expected):
    entry = PolicyEntry.from_attributes(
        {"queuePrefetch": 7, "queueBrowserPrefetch": 8, "topicPrefetch": 9, "durableTopicPrefetch": 11}
    )
    assert effective_prefetch(entry, kind, requested) == expected


def test_without_a_policy_a_consumer_keeps_the_client_default():
    assert effective_prefetch(CLASS_DEFAULTS, "queue", None) == 1000
    assert effective_prefetch(CLASS_DEFAULTS, "topic", None) == 32767


def test_a_negative_prefetch_is_a_consumer_error():
    with pytest.raises(InvalidConsumer, match="prefetch must be an integer >= 0, got -1"):
        effective_prefetch(PolicyEntry(), "queue", -1)


# -- dead-letter destinations (§5.4)


def test_dead_letter_destinations_follow_the_strategy():
    shared = PolicyEntry()
    assert shared.dead_letter_destination_for(q("orders")) == q("ActiveMQ.DLQ")
    assert shared.dead_letter_destination_for(t("prices")) == q("ActiveMQ.DLQ")
    individual = PolicyEntry.from_attributes({"deadLetterStrategy": "individual"})
    assert individual.dead_letter_destination_for(q("orders")) == q("ActiveMQ.DLQ.Queue.orders")
    assert individual.dead_letter_destination_for(t("prices")) == q("ActiveMQ.DLQ.Topic.prices")
    custom = PolicyEntry.from_attributes(
        {
            "deadLetterStrategy": "individual",
            "topicPrefix": "DLQ.",
            "topicSuffix": ".dead",
            "useQueueForTopicMessages": False,
            "destinationPerDurableSubscriber": True,
        }
    )
    assert custom.dead_letter_destination_for(t("prices"), durable_subscription="app:sub1") == t(
        "DLQ.prices.app:sub1.dead"
    )
    discarding = PolicyEntry.from_attributes({"deadLetterStrategy": "discarding"})
    assert discarding.dead_letter_destination_for(q("orders")) is None


# -- TOML files


def test_the_example_file_loads_and_resolves():
    m = load_policy_file(EXAMPLE_FILE)
    assert m.resolve(q("orders.eu")).message_group_map_factory_type == "bucket"
    assert m.resolve(q("orders.eu")).group_map_bucket_count == 256
    assert m.resolve(q("orders.audit")).prioritized_messages is True
    assert m.resolve(q("orders.audit")).message_group_map_factory_type == "cached"  # no merging
    assert m.resolve(q("billing")).dead_letter_destination_for(q("billing")) == q("DLQ.billing")
    assert m.resolve(t("prices.ibm")).eviction_property_name == "symbol"
    assert m.resolve(t("news")).pending_message_limit == 1000


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_a_good_file_with_a_default_entry_and_composite_pattern(tmp_path):
    path = write(
        tmp_path,
        """
        [broker]            # other tables belong to other parts of Signalbox
        name = "x"

        [policy.default]
        queuePrefetch = 3

        [[policy.entry]]
        queue = "orders.>, billing.>"
        maximumRedeliveries = 1
        """,
    )
    m = load_policy_file(path)
    assert sorted(e.id for e in m.entries) == ["queue://billing.>", "queue://orders.>"]
    assert m.resolve(q("billing.x")).maximum_redeliveries == 1
    assert m.resolve(t("prices")).queue_prefetch == 3
    assert PolicyMap.from_config(m.to_config()).to_config() == m.to_config()


def test_a_file_without_policies_gives_class_defaults(tmp_path):
    assert load_policy_file(write(tmp_path, "")).resolve(q("orders")) is CLASS_DEFAULTS


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[[policy.entry]]\nqueue = 'a'\nqueuePrefetch = -1\n",
         "policy.entry #1 (queue = 'a'): queuePrefetch must be an integer between 0 and 32767, got -1"),
        ("[[policy.entry]]\nqueue = 'a'\n[[policy.entry]]\ntopic = 'b'\nprioritizeMessages = true\n",
         "policy.entry #2 (topic = 'b'): unknown policy attribute 'prioritizeMessages'; did you mean"),
        ("[[policy.entry]]\nqueuePrefetch = 1\n", "policy.entry #1 must name exactly one of queue"),
        ("[[policy.entry]]\nqueue = 'a'\ntopic = 'a'\n", "must name exactly one of queue"),
        ("[[policy.entry]]\ntempQueue = true\n", "policy.entry #1: ActiveMQ's tempQueue is not supported"),
        ("[[policy.entry]]\nqueue = 'a b'\n", "policy.entry #1 (queue = 'a b'): invalid destination name"),
        ("[[policy.entry]]\nqueue = 'a,topic://b'\n", "names a topic (topic://b)"),
        ("[[policy.entry]]\nqueue = 5\n", "queue must be a string pattern"),
        ("[[policy.entry]]\nqueue = 'a'\n[[policy.entry]]\nqueue = 'a'\n", "two policy entries for queue://a"),
        ("[policy]\nentries = []\n", "unknown key 'entries'; did you mean 'entry'?"),
        ("[policy.default]\nqueuePrefetch = 'x'\n", "default policy entry: queuePrefetch must be an integer"),
        ("policy = 3\n", "'policy' must be a table"),
        ("[policy]\nentry = 3\n", "policy.entry must be an array of tables"),
        ("[[policy.entry]\nqueue = 'a'\n", "not valid TOML"),
    ],
)
def test_bad_files_are_rejected_with_the_file_entry_and_attribute(tmp_path, text, complaint):
    path = write(tmp_path, text)
    with pytest.raises(InvalidPolicy) as caught:
        load_policy_file(path)
    assert complaint in caught.value.message
    assert caught.value.message.startswith(str(path))


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_an_entry_for_temporary_destinations_only_is_refused_naming_its_attribute(kind):
    """Temporary destinations are supported (STOMP /temp-queue/, /temp-topic/); ActiveMQ's tempQueue /
    tempTopic entry, which applies to them alone, is not. The refusal names that attribute, on its own or
    beside a pattern, and the entries it says apply to a temporary destination instead do."""
    attribute = f"temp{kind.title()}"
    for entry in ({attribute: True}, {kind: "a", attribute: True}):
        with pytest.raises(InvalidPolicy) as caught:
            PolicyMap.from_config({"entry": [entry]})
        message = caught.value.message
        refusal = (f"ActiveMQ's {attribute} is not supported by Signalbox: it makes an entry for "
                   f"temporary {kind}s only, and Signalbox has no such entries; a temporary {kind} "
                   f"(STOMP /temp-{kind}/) takes the {kind} entries that match its name, "
                   f'ID:<connection id>:<n> ({kind} = ">" does)')
        assert refusal in message, message
        assert caught.value.details == {"attribute": attribute, "entry": 1}
    temporary = parse_destination(f"temp-{kind}://ID:tcp-0123456789abcdef:1")
    prefetch = f"{kind}Prefetch"
    resolved = PolicyMap.from_config({"entry": [{kind: ">", prefetch: 7}]}).resolve(temporary)
    assert getattr(resolved, f"{kind}_prefetch") == 7


def test_allow_temp_destination_stealing_is_refused_with_what_signalbox_does():
    with pytest.raises(InvalidPolicy) as caught:
        PolicyMap.from_config({"entry": [{"queue": "a", "allowTempDestinationStealing": True}]})
    assert caught.value.message.endswith(
        "ActiveMQ's allowTempDestinationStealing is not supported by Signalbox: only the connection that "
        "made a temporary destination may consume from it (as with ActiveMQ's default, false)")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(InvalidPolicy, match="does not exist"):
        load_policy_file(tmp_path / "nope.toml")


# -- the Redis store


@pytest.fixture
def store(redis_client, namespace):
    s = PolicyStore(redis_client, namespace)
    yield s
    redis_client.delete(s.key, s.version_key)


def test_a_runtime_change_is_visible_through_another_store_instance(store, redis_client):
    other = PolicyStore(redis_client, store.namespace)
    assert other.resolve(q("orders.eu")) is CLASS_DEFAULTS
    store.set_entry("queue", "orders.>", {"queuePrefetch": 5})
    assert other.resolve(q("orders.eu")).queue_prefetch == 5
    store.set_entry("queue", "orders.>", {"queuePrefetch": 6})
    assert other.resolve(q("orders.eu")).queue_prefetch == 6
    assert store.remove_entry("queue", "orders.>") is True
    assert other.resolve(q("orders.eu")) is CLASS_DEFAULTS
    assert store.remove_entry("queue", "orders.>") is False


def test_every_change_increments_the_version(store, redis_client):
    assert store.version() == 0
    store.set_entry("queue", ">", {})
    store.set_default({"queuePrefetch": 1})
    store.remove_entry("queue", ">")
    assert int(redis_client.get(store.version_key)) == store.version() == 3


def test_entries_are_stored_as_json_under_their_pattern_uri(store, redis_client):
    store.set_entry("topic", "prices.*", {"topicPrefetch": 10, "messageGroupMapFactoryType": "simple"})
    raw = redis_client.hget(store.key, "topic://prices.*")
    assert json.loads(raw) == {
        "kind": "topic",
        "pattern": "prices.*",
        "attributes": {"topicPrefetch": 10, "messageGroupMapFactoryType": "simple"},
    }
    [entry] = store.entries()
    assert (entry.id, dict(entry.attributes)) == ("topic://prices.*", {
        "topicPrefetch": 10, "messageGroupMapFactoryType": "simple"
    })


@pytest.mark.parametrize(
    ("kind", "pattern", "attributes", "error"),
    [
        ("queue", "orders.>", {"queuePrefetch": -1}, InvalidPolicy),
        ("queue", "orders.>", {"prioritizeMessages": True}, InvalidPolicy),
        ("queue", "orders..x", {}, InvalidDestination),
        ("queue", "topic://orders", {}, InvalidDestination),
        ("exchange", "orders", {}, InvalidPolicy),
    ],
)
def test_a_bad_set_entry_changes_nothing(store, redis_client, kind, pattern, attributes, error):
    store.set_entry("queue", "orders.>", {"queuePrefetch": 5})
    before = (redis_client.hgetall(store.key), store.version())
    with pytest.raises(error):
        store.set_entry(kind, pattern, attributes)
    assert (redis_client.hgetall(store.key), store.version()) == before
    assert store.resolve(q("orders.a")).queue_prefetch == 5


def test_a_bad_default_entry_changes_nothing(store, redis_client):
    with pytest.raises(InvalidPolicy, match="default policy entry: queuePrefetch"):
        store.set_default({"queuePrefetch": -3})
    assert redis_client.exists(store.key, store.version_key) == 0


def test_load_from_replaces_everything(store):
    store.set_entry("queue", "old.>", {"queuePrefetch": 1})
    store.load_from(load_policy_file(EXAMPLE_FILE))
    ids = {e.id for e in store.entries()}
    assert "queue://old.>" not in ids
    assert {"queue://>", "queue://orders.>", "queue://orders.audit", "topic://>", "topic://prices.*"} == ids
    assert store.resolve(q("orders.eu")).group_map_bucket_count == 256
    assert store.policy_map().default is not None
    store.load_from(PolicyMap())
    assert store.entries() == [] and store.policy_map().default is None


def test_the_default_entry_is_stored_and_removed(store, redis_client):
    store.set_default({"queuePrefetch": 2})
    assert PolicyStore(redis_client, store.namespace).resolve(t("x")).queue_prefetch == 2
    store.set_default(None)
    assert PolicyStore(redis_client, store.namespace).resolve(t("x")) is CLASS_DEFAULTS


def test_the_policy_map_is_cached_until_the_version_changes(store, redis_client):
    store.set_entry("queue", ">", {"queuePrefetch": 4})
    first = store.policy_map()
    assert store.policy_map() is first
    PolicyStore(redis_client, store.namespace).set_entry("queue", ">", {"queuePrefetch": 8})
    assert store.policy_map() is not first
    assert store.resolve(q("a")).queue_prefetch == 8


def test_a_check_interval_bounds_how_often_the_version_is_read(store, redis_client):
    lazy = PolicyStore(redis_client, store.namespace, check_interval=3600)
    assert lazy.resolve(q("a")) is CLASS_DEFAULTS
    store.set_entry("queue", ">", {"queuePrefetch": 4})
    assert lazy.resolve(q("a")) is CLASS_DEFAULTS  # not re-checked within the interval
    lazy.check_interval = 0
    assert lazy.resolve(q("a")).queue_prefetch == 4


def test_an_unreadable_stored_entry_is_reported_with_its_key(store, redis_client):
    redis_client.hset(store.key, "queue://x", "{not json")
    redis_client.incr(store.version_key)
    with pytest.raises(InvalidPolicy, match=r"stored policy 'queue://x' in .*:policies is unreadable"):
        store.policy_map()


def test_the_resolved_hash_for_a_destination_comes_from_the_store(store):
    store.set_entry("queue", "orders.>", {"messageGroupMapFactoryType": "bucket?bucketCount=4"})
    stored = store.resolve(parse_destination("orders.eu")).to_redis_hash()
    assert (stored["messageGroupMapFactoryType"], stored["groupMapBucketCount"]) == ("bucket", "4")
    assert stored["policyOrigin"] == "queue://orders.>"


def test_normalized_attributes_are_flat_and_canonical():
    assert normalize_attributes({"deadLetterStrategy": "individualDeadLetterStrategy?queuePrefix=D."}) == {
        "deadLetterStrategy": "individual",
        "queuePrefix": "D.",
    }
