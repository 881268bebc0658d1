"""A SEND's headers as message fields (gateway.stomp.headers.message_from_send), fuzzed: whatever the
headers' names, repeats and values (the JMS-named ones, the numbers, reply-to, amq-msg-type and the body's
encoding among them), the frame becomes a message or is refused with a StompError naming what is wrong;
nothing else escapes to end the connection with an internal error."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_core.messages import Message
from gateway.stomp.frames import Frame
from gateway.stomp.headers import StompError, message_from_send

NAMES = ["destination", "content-length", "content-type", "persistent", "priority", "expires", "timestamp",
         "type", "correlation-id", "reply-to", "JMSXGroupID", "JMSXGroupSeq", "JMSRedelivered",
         "JMSPriority", "JMSType", "JMSCorrelationID", "JMSDeliveryMode", "JMSExpiration", "JMSReplyTo",
         "JMSTimestamp", "JMSXDeliveryCount", "JMSXUserID", "amq-msg-type", "AMQ_SCHEDULED_DELAY",
         "AMQ_SCHEDULED_PERIOD", "AMQ_SCHEDULED_REPEAT", "AMQ_SCHEDULED_CRON", "plain"]
SPECIAL = ["", "0", "-1", "2", "9", "+5", "-0", "9" * 30, "-" + "9" * 30, " 5", "1_0", "５", "1e3", "0x10",
           "true", "TRUE", "PERSISTENT", "non_persistent", "text", "Bytes", "map", "/queue/", "/topic/",
           "/queue/r", "/temp-queue/x", "/remote-temp-queue/x", "/temp-topic/", "topic://t", "queue://",
           "temp-queue://ID:x", "queue://a,b", "a" * 300, "\x00", "\u2028", "\udcff"[:0] + "é",
           "* * * * *", "not cron"]
values = st.one_of(st.sampled_from(SPECIAL), st.text(max_size=40))


@given(st.lists(st.tuples(st.sampled_from(NAMES), values), max_size=12),
       st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"\xff\xfe", "é".encode()])))
@settings(max_examples=3000, deadline=None)
def test_any_send_headers_make_a_message_or_a_stomp_error(headers, body):
    frame = Frame("SEND", (("destination", "/queue/fuzz"), *headers), body)
    try:
        message = message_from_send(frame, "conn-1")
    except StompError as exc:
        assert exc.message  # (what is wrong, for the ERROR frame)
        return
    assert isinstance(message, Message)
    assert 0 <= message.priority <= 9
    assert message.expiration >= 0


def test_a_send_carrying_a_scheduled_job_id_keeps_its_schedule_headers_as_properties():
    """SchedulerBroker.send schedules only a message without AMQ_SCHEDULED_ID (scheduledJobId): a BROWSE's
    reply re-sent as it came is no job, its AMQ_SCHEDULED_* headers mere properties (text, unchecked, as
    ActiveMQ's translator leaves any header)."""
    headers = (("destination", "/queue/again"), ("scheduledJobId", "ID:job-1"),
               ("AMQ_SCHEDULED_DELAY", "60000"), ("AMQ_SCHEDULED_PERIOD", "soon"),
               ("AMQ_SCHEDULED_REPEAT", "2"), ("AMQ_SCHEDULED_CRON", "* * * * *"))
    message = message_from_send(Frame("SEND", headers, b"x"), "conn-1")
    assert (message.delay_ms, message.period_ms, message.repeat, message.cron) == (None, None, 0, None)
    assert message.properties == dict(headers[1:])
