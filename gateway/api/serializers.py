"""The API's resource shapes: one serializer per resource, used for validation of the slower
endpoints and for the OpenAPI schema of all (the hot paths parse with gateway.api.codec)."""

from __future__ import annotations

from rest_framework import serializers

from broker_core.messages import MAX_DELAY_MS, MAX_REPEAT
from broker_core.model import DEFAULT_LEASE_MS


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details; extension members depend on `code`."""

    type = serializers.CharField()
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    instance = serializers.CharField(required=False)
    code = serializers.CharField()
    position = serializers.IntegerField(required=False, help_text="Bad selector: 1-based column.")
    expected = serializers.CharField(required=False, help_text="Bad selector: what the parser expected.")
    errors = serializers.DictField(required=False, help_text="Validation errors by field.")
    retry_after = serializers.FloatField(required=False, help_text="Seconds (also the Retry-After header).")


class TypedPropertySerializer(serializers.Serializer):
    type = serializers.ChoiceField(["string", "boolean", "int", "long", "double"])
    value = serializers.JSONField()


class MessageEnvelopeSerializer(serializers.Serializer):
    """A message to send. Properties are string, number, boolean, or {"type", "value"}."""

    body = serializers.CharField(required=False, allow_blank=True, help_text="Text body.")
    body_base64 = serializers.CharField(required=False, help_text="Bytes body, base64.")
    content_type = serializers.CharField(required=False)
    priority = serializers.IntegerField(required=False, min_value=0, max_value=9, default=4)
    persistent = serializers.BooleanField(required=False, default=True)
    ttl = serializers.IntegerField(required=False, min_value=0, help_text="Time to live, ms.")
    expiration = serializers.IntegerField(required=False, min_value=0,
                                          help_text="Expiry, ms since the epoch.")
    correlation_id = serializers.CharField(required=False)
    reply_to = serializers.CharField(required=False)
    type = serializers.CharField(required=False)
    group_id = serializers.CharField(required=False, help_text="JMSXGroupID")
    group_seq = serializers.IntegerField(required=False, help_text="JMSXGroupSeq; -1 closes the group")
    properties = serializers.DictField(required=False, child=serializers.JSONField())
    cron = serializers.CharField(required=False,
                                 help_text="AMQ_SCHEDULED_CRON: minute hour day-of-month month day-of-week "
                                           "(UTC); delivers at each time it names until cancelled.")
    period = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DELAY_MS,
                                      help_text="AMQ_SCHEDULED_PERIOD: ms between repeated deliveries.")
    repeat = serializers.IntegerField(required=False, min_value=0, max_value=MAX_REPEAT,
                                      help_text="AMQ_SCHEDULED_REPEAT: deliveries after the first.")
    delay = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DELAY_MS,
                                     help_text="Scheduled delivery (AMQ_SCHEDULED_DELAY): ms after the send.")


class SendRequestSerializer(MessageEnvelopeSerializer):
    """One envelope, or {"messages": [envelope, ...]} for a batch (1-1000, sent in order)."""

    messages = MessageEnvelopeSerializer(many=True, required=False)


class SendResultSerializer(serializers.Serializer):
    message_ids = serializers.ListField(child=serializers.CharField())
    statuses = serializers.ListField(
        child=serializers.ChoiceField(["ok", "duplicate", "expired"]),
        help_text="Per message: ok (enqueued), duplicate (already stored or recently sent: not enqueued "
                  "again), expired (expired on arrival).")
    destinations = serializers.ListField(child=serializers.CharField())
    jobs = serializers.ListField(
        child=serializers.IntegerField(), required=False,
        help_text="Only for a send to ActiveMQ.Scheduler.Management (scheduler management: "
                  "AMQ_SCHEDULER_ACTION BROWSE, REMOVE or REMOVEALL, delivered to nobody): per message, how "
                  "many scheduled jobs it sent to its reply_to or cancelled.")


class MessageFieldsSerializer(serializers.Serializer):
    """What every message shown by the API carries: headers, properties, body, redelivery."""

    message_id = serializers.CharField()
    destination = serializers.CharField()
    body = serializers.CharField(allow_null=True)
    body_base64 = serializers.CharField(required=False)
    content_type = serializers.CharField(allow_null=True)
    priority = serializers.IntegerField()
    persistent = serializers.BooleanField()
    timestamp = serializers.IntegerField()
    expiration = serializers.IntegerField()
    correlation_id = serializers.CharField(allow_null=True)
    reply_to = serializers.CharField(allow_null=True)
    type = serializers.CharField(allow_null=True)
    group_id = serializers.CharField(allow_null=True)
    group_seq = serializers.IntegerField()
    properties = serializers.DictField(child=serializers.JSONField())
    redelivered = serializers.BooleanField()
    delivery_count = serializers.IntegerField(help_text="JMSXDeliveryCount")


class DeliverySerializer(MessageFieldsSerializer):
    group_first_for_consumer = serializers.BooleanField(help_text="JMSXGroupFirstForConsumer")


class StoredMessageSerializer(MessageFieldsSerializer):
    """A message as browsing shows it: a delivery's fields (without group_first_for_consumer), its
    state and, in flight, the consumer holding it."""

    state = serializers.ChoiceField(["pending", "parked", "inflight"], allow_null=True)
    consumer_id = serializers.CharField(allow_null=True)
    original_destination = serializers.CharField(
        allow_null=True, help_text="Where the message was first sent (a dead letter's origin, where retry "
                                   "sends it; a topic's copy: the topic). None when not recorded.")


class ReceiveResultSerializer(serializers.Serializer):
    messages = DeliverySerializer(many=True)


class ConsumerCreateSerializer(serializers.Serializer):
    selector = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=10_000)
    prefetch = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=32767,
                                        help_text="Omit for the policy's default; 0 pulls on receive.")
    priority = serializers.IntegerField(required=False, default=0, min_value=-128, max_value=127)
    exclusive = serializers.BooleanField(required=False, default=False)
    no_local = serializers.BooleanField(required=False, default=False)
    ack_mode = serializers.ChoiceField(["client-individual", "client", "auto"], required=False,
                                       default="client-individual")
    lease_ms = serializers.IntegerField(required=False, default=DEFAULT_LEASE_MS, min_value=1000,
                                        max_value=3_600_000)
    client_id = serializers.CharField(required=False, allow_blank=True, allow_null=True, max_length=200)
    subscription_name = serializers.CharField(
        required=False, allow_null=True, max_length=200,
        help_text="Topics: with client_id, a durable subscription (created, or taken up again).")
    retroactive = serializers.BooleanField(
        required=False, default=False, help_text="Topics: first replay what the recovery policy kept.")


class HttpConsumerSerializer(serializers.Serializer):
    consumer_id = serializers.CharField()
    destination = serializers.CharField()
    ack_mode = serializers.CharField()
    prefetch = serializers.IntegerField()
    lease_ms = serializers.IntegerField()
    selector = serializers.CharField(allow_null=True)
    priority = serializers.IntegerField()
    exclusive = serializers.BooleanField()
    no_local = serializers.BooleanField()
    client_id = serializers.CharField(allow_null=True)
    subscription_name = serializers.CharField(allow_null=True)
    links = serializers.DictField(child=serializers.CharField())


class AckRequestSerializer(serializers.Serializer):
    message_ids = serializers.ListField(child=serializers.CharField(), min_length=1, max_length=1000)
    mode = serializers.ChoiceField(["individual", "cumulative", "delivered"], required=False,
                                   help_text="Default: the consumer's ack mode.")


class AckResultSerializer(serializers.Serializer):
    acknowledged = serializers.IntegerField(allow_null=True, help_text="null when ?receive= was given")
    messages = DeliverySerializer(many=True)


class NackRequestSerializer(serializers.Serializer):
    message_ids = serializers.ListField(child=serializers.CharField(), min_length=1, max_length=1000)
    poison = serializers.BooleanField(required=False, default=False,
                                      help_text="Dead-letter at once instead of redelivering.")


class NackResultSerializer(serializers.Serializer):
    dead_lettered = serializers.IntegerField(help_text="Sent to the dead-letter queue (poison, or past "
                                             "maximumRedeliveries).")
    redelivered = serializers.IntegerField(help_text="Coming back after the policy's redelivery delay.")


class HeartbeatSerializer(serializers.Serializer):
    consumer_id = serializers.CharField()
    lease_expires = serializers.IntegerField(help_text="ms since the epoch")


class ConsumerStatsSerializer(serializers.Serializer):
    consumer_id = serializers.CharField()
    client_id = serializers.CharField(allow_null=True)
    connection_id = serializers.CharField(allow_null=True)
    selector = serializers.CharField(allow_null=True)
    priority = serializers.IntegerField()
    exclusive = serializers.BooleanField()
    ack_mode = serializers.CharField()
    prefetch = serializers.IntegerField()
    prefetch_extension = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    undelivered = serializers.IntegerField()
    dispatched = serializers.IntegerField()
    acked = serializers.IntegerField()
    groups = serializers.IntegerField()
    lease_expires = serializers.IntegerField(allow_null=True)
    added = serializers.IntegerField()
    last_ack = serializers.IntegerField(allow_null=True)
    is_exclusive_owner = serializers.BooleanField()
    full = serializers.BooleanField(help_text="In flight reached the prefetch.")
    slow = serializers.BooleanField()


class DestinationSerializer(serializers.Serializer):
    destination = serializers.CharField()
    kind = serializers.CharField()
    name = serializers.CharField()
    temporary = serializers.BooleanField(
        required=False, help_text="A STOMP connection's temporary queue or topic (named ID:<connection "
                                  "id>:<n>), deleted with its messages when that connection ends.")
    queue_size = serializers.IntegerField()
    pending = serializers.IntegerField()
    in_flight = serializers.IntegerField()
    messages = serializers.IntegerField(
        required=False, help_text="Pending + in flight: a queue's QueueSize; a topic's, all its "
                                  "subscriptions' (the destination list; its QueueSize is 0).")
    largest_subscription = serializers.DictField(
        required=False, allow_null=True,
        help_text="A topic's subscription with the most messages: key, label, messages, active (the list).")
    enqueued = serializers.IntegerField()
    dequeued = serializers.IntegerField()
    dispatched = serializers.IntegerField()
    expired = serializers.IntegerField()
    expired_on_arrival = serializers.IntegerField()
    deadlettered = serializers.IntegerField(required=False)
    discarded = serializers.IntegerField(required=False,
                                         help_text="Dead letters dropped (no dead-letter queue).")
    evicted = serializers.IntegerField(
        required=False, help_text="A topic's: given up by a subscription's eviction strategy (ended ones "
                                  "included); 0 for a queue.")
    dropped = serializers.IntegerField(
        required=False, help_text="A topic's: dropped by a pending-message limit of 0 or a non-durable "
                                  "subscription's poison (ended ones included); 0 for a queue.")
    discards = serializers.IntegerField(
        required=False, help_text="evicted + dropped + discarded: what the rate history's `discarded` "
                                  "series counts.")
    parked = serializers.IntegerField(required=False,
                                      help_text="Waiting for a redelivery delay or a schedule: scheduled + "
                                                "redelivery_delayed.")
    scheduled = serializers.IntegerField(
        required=False, help_text="Scheduled jobs not yet due (delayed messages, repeating and cron jobs): "
                                  "what GET …/scheduled lists.")
    redelivery_delayed = serializers.IntegerField(
        required=False, help_text="Messages waiting for a redelivery delay (a topic's: its subscriptions').")
    forwarding = serializers.IntegerField(required=False)
    forward_refused = serializers.IntegerField(
        required=False, help_text="Virtual destination copies made here that their target refused for good.")
    forward_dropped = serializers.IntegerField(
        required=False, help_text="Virtual topic copies dropped because their full consumer queue has "
                                  "dropOnResourceLimit.")
    purged = serializers.IntegerField(required=False)
    moved = serializers.IntegerField(required=False)
    events = serializers.IntegerField(required=False,
                                      help_text="Lifecycle events in the stream (eventsMaxLen).")
    events_trimmed = serializers.IntegerField(
        required=False, help_text="Events trimmed off the stream at its bound (events only, no message).")
    audit_size = serializers.IntegerField(
        required=False, help_text="Message ids in the duplicate audit (maxQueueAuditDepth).")
    duplicates = serializers.IntegerField()
    skipped = serializers.IntegerField()
    last_pass_skipped = serializers.IntegerField()
    selector_errors = serializers.IntegerField(
        required=False, help_text="Selector evaluations that failed on a message (no match), e.g. a limit.")
    consumer_count = serializers.IntegerField(
        help_text="Consumers, and a queue's open browsers (STOMP browser:true), as ActiveMQ's ConsumerCount.")
    browsers = serializers.IntegerField(
        required=False, help_text="A queue's open browsers (counted in consumer_count, not in consumers).")
    group_count = serializers.IntegerField()
    paused = serializers.BooleanField()
    exclusive_owner = serializers.CharField(allow_null=True)


class DestinationDetailSerializer(DestinationSerializer):
    consumers = ConsumerStatsSerializer(many=True)
    policy = serializers.DictField(child=serializers.JSONField())


class DestinationPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = DestinationSerializer(many=True)
    hidden = serializers.IntegerField(
        help_text="Destinations (of the kind asked for) that exist but the user may not read: a count, "
                  "never their names. 0 for full readers.")


class GroupSerializer(serializers.Serializer):
    group_id = serializers.CharField()
    owner = serializers.CharField()
    assigned_at = serializers.IntegerField()


class GroupPageSerializer(serializers.Serializer):
    groups = GroupSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Pass as `cursor` for the next page; null "
                                        "at the end.")


class CountSerializer(serializers.Serializer):
    count = serializers.IntegerField()


class RemovedSerializer(serializers.Serializer):
    removed = serializers.IntegerField(help_text="Messages the destination held.")


class BrowsePageSerializer(serializers.Serializer):
    messages = StoredMessageSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class ScheduledMessageSerializer(StoredMessageSerializer):
    due = serializers.IntegerField(allow_null=True, help_text="When it becomes visible (ms since the epoch).")
    period = serializers.IntegerField(allow_null=True, help_text="A repeating job's period (ms).")
    repeats_left = serializers.IntegerField(allow_null=True, help_text="A repeating job's repeats left.")
    cron = serializers.CharField(allow_null=True, help_text="A cron job's expression (AMQ_SCHEDULED_CRON); "
                                                            "`due` is its next time.")


class ScheduledPageSerializer(serializers.Serializer):
    messages = ScheduledMessageSerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class TargetSerializer(serializers.Serializer):
    target = serializers.CharField(help_text="Destination to move or copy to (a queue by default).")


class MatchingSerializer(serializers.Serializer):
    selector = serializers.CharField(allow_blank=True, required=False, default="")
    target = serializers.CharField(required=False,
                                   help_text="Required for move and copy; none for retry and remove.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1_000_000)


class PolicyEntrySerializer(serializers.Serializer):
    id = serializers.CharField(read_only=True)
    kind = serializers.ChoiceField(["queue", "topic"], read_only=True)
    pattern = serializers.CharField(read_only=True)
    attributes = serializers.DictField(child=serializers.JSONField())


class PolicyWriteSerializer(serializers.Serializer):
    attributes = serializers.DictField(child=serializers.JSONField(),
                                       help_text="ActiveMQ PolicyEntry attributes, camelCase.")


class AuditRecordSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    username = serializers.CharField()
    action = serializers.CharField()
    destination = serializers.CharField()
    target = serializers.CharField()
    parameters = serializers.DictField()
    succeeded = serializers.BooleanField()
    status_code = serializers.IntegerField()
    result = serializers.DictField(help_text="The response: `count` (messages or items the action affected) "
                                             "when it has one, or the problem details when it failed.")


class AuditPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)
    results = AuditRecordSerializer(many=True)
    actions = serializers.ListField(child=serializers.CharField(),
                                    help_text="Every action the audit log has recorded (filter choices).")
