"""ActiveMQ's web console XML feeds (gateway/api/webconsole_xml.py) over the real ASGI app and a real Redis:
what Telegraf's `activemq` input reads, /admin/xml/queues.jsp, topics.jsp and subscribers.jsp, as ActiveMQ
5.17.2's JSPs write them."""

from __future__ import annotations

import base64
import uuid
import xml.etree.ElementTree as ET

import pytest

from broker_core.model import ConsumerSpec
from gateway import runtime

pytestmark = pytest.mark.django_db(transaction=True)


def basic(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw".encode()).decode()}


@pytest.fixture
def names():
    tag = uuid.uuid4().hex[:8]  # (the feeds list the whole broker: this test's own names)
    return {"q": f"wc{tag}.orders", "other": f"wc{tag}.hidden", "t": f"wc{tag}.prices", "tag": tag}


@pytest.fixture
def ops(make_user):
    make_user("ops", [("queue://>", "admin"), ("topic://>", "admin")])
    return basic("ops")


@pytest.fixture
def narrow(make_user, names):
    make_user("narrow", [(f"queue://{names['q']}", "read")])
    return basic("narrow")


async def feed(api, headers, name: str) -> ET.Element:
    answer = await api.get(f"/admin/xml/{name}.jsp", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/xml;charset=utf-8"
    return ET.fromstring(answer.text)


async def send(api, headers, path: str, count: int = 1) -> None:
    for _ in range(count):
        sent = await api.post(f"/api/message/{path}", content="hello", headers=headers)
        assert sent.status_code == 200, sent.text


async def test_queues_and_topics_as_telegraf_reads_them(api, ops, names):
    await send(api, ops, f"{names['q']}?type=queue", 3)
    await send(api, ops, f"{names['t']}?type=topic", 2)
    await runtime.async_broker().add_consumer(f"queue://{names['q']}", ConsumerSpec(prefetch=1))
    queues = await feed(api, ops, "queues")
    assert queues.tag == "queues"
    (queue,) = [q for q in queues.findall("queue") if q.get("name") == names["q"]]
    assert queue.find("stats").attrib == {"size": "3", "consumerCount": "1", "enqueueCount": "3",
                                          "dequeueCount": "0"}
    topics = await feed(api, ops, "topics")
    # ActiveMQ's topics.jsp writes a space after the name (Telegraf keeps it: it trims a queue's only)
    (topic,) = [t for t in topics.findall("topic") if t.get("name") == names["t"] + " "]
    assert topic.find("stats").attrib == {"size": "0", "consumerCount": "0", "enqueueCount": "2",
                                          "dequeueCount": "0"}  # (a topic's QueueSize is 0, as ActiveMQ's)
    assert not [q for q in queues.findall("queue") if q.get("name", "").startswith("ID:")]  # no temporary


async def test_a_user_sees_the_destinations_they_may_read_and_no_login_is_401(api, ops, narrow, names):
    await send(api, ops, f"{names['q']}?type=queue")
    await send(api, ops, f"{names['other']}?type=queue")
    listed = {q.get("name") for q in (await feed(api, narrow, "queues")).findall("queue")}
    assert names["q"] in listed and names["other"] not in listed
    assert (await api.get("/admin/xml/queues.jsp")).status_code == 401
    unknown = await api.get("/admin/xml/nothing.jsp", headers=ops)
    assert unknown.status_code == 404 and "queues, topics, subscribers" in unknown.json()["detail"]
    assert (await api.get("/admin/", follow_redirects=False)).status_code == 302  # the admin site is there


async def test_names_are_escaped_as_jstl_escapes_them(api, ops, names):
    odd = f"wc{names['tag']}.a&b'c\"d"
    await send(api, ops, f"x?type=queue&destination=wc{names['tag']}.a%26b'c%22d")
    answer = await api.get("/admin/xml/queues.jsp", headers=ops)
    assert f'name="wc{names["tag"]}.a&amp;b&#039;c&#034;d"' in answer.text
    assert odd in {q.get("name") for q in ET.fromstring(answer.text).findall("queue")}


async def test_durable_subscribers_active_and_offline(api, ops, names):
    broker = runtime.async_broker()
    topic, client = f"topic://{names['t']}", f"app{names['tag']}"
    await broker.ensure_destination(topic)
    live = await broker.add_consumer(topic, ConsumerSpec(client_id=client, subscription_name="live",
                                                         selector="colour = 'red'"))
    gone = await broker.add_consumer(topic, ConsumerSpec(client_id=client, subscription_name="gone"))
    await broker.close_consumer(gone, "test")
    await broker.add_consumer(topic, ConsumerSpec())  # non-durable: not listed
    await broker.send(topic, "m")  # (the live one's selector does not match)
    subscribers = [s for s in (await feed(api, ops, "subscribers")).findall("subscriber")
                   if s.get("destinationName") == names["t"]]
    assert [(s.get("subscriptionName"), s.get("active")) for s in subscribers] == [("live", "yes"),
                                                                                  ("gone", "no")]
    assert subscribers[0].attrib == {"clientId": client, "subscriptionName": "live",
                                     "connectionId": "", "destinationName": names["t"],
                                     "selector": "colour = 'red'", "active": "yes"}
    assert subscribers[1].find("stats").attrib == {"pendingQueueSize": "1", "dispatchedQueueSize": "0",
                                                   "dispatchedCounter": "0", "enqueueCounter": "1",
                                                   "dequeueCounter": "0"}
    await broker.close_consumer(live, "test")


async def test_the_subscribers_feed_refuses_past_its_limit_by_name(api, ops, names, settings):
    broker = runtime.async_broker()
    topic = f"topic://{names['t']}"
    await broker.ensure_destination(topic)
    for n in range(3):
        await broker.add_consumer(topic, ConsumerSpec(client_id=f"n{names['tag']}",
                                                      subscription_name=f"s{n}"))
    from gateway.api import common

    settings.SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS = 2
    common._settings_read.pop("SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS", None)
    try:
        refused = await api.get("/admin/xml/subscribers.jsp", headers=ops)
    finally:
        common._settings_read.pop("SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS", None)
    assert refused.status_code == 503
    assert "SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS" in refused.json()["detail"]
