"""ActiveMQ's Jolokia agent, read side, at /api/jolokia (gateway/api/jolokia.py): the requests monitoring
tools make of an ActiveMQ broker get ActiveMQ's answers, over the real ASGI app and a real Redis."""

from __future__ import annotations

import base64

import pytest

from broker_core.broker import Broker
from broker_core.messages import Message
from broker_core.model import ConsumerSpec
from gateway.api import mbeans
from tests.gateway_api.mixins import blocking, token_headers
from tests.helpers.broker import drain

pytestmark = pytest.mark.django_db(transaction=True)

BROKER = "org.apache.activemq:brokerName=localhost,type=Broker"
HEALTH = "org.apache.activemq:brokerName=localhost,service=Health,type=Broker"


def queue_bean(name: str, kind: str = "Queue") -> str:
    return (f"org.apache.activemq:brokerName=localhost,destinationName={name},destinationType={kind},"
            "type=Broker")


@pytest.fixture
def admin_basic(make_user):
    make_user("amq", [("queue://>", "admin"), ("topic://>", "admin")])
    return {"Authorization": "Basic " + base64.b64encode(b"amq:pw").decode()}


async def send(api, headers, path: str, count: int = 1) -> None:
    for _ in range(count):
        sent = await api.post(f"/api/message/{path}", content="hello", headers=headers)
        assert sent.status_code == 200, sent.text


async def jolokia(api, headers, path: str = "", **params):
    answer = await api.get(f"/api/jolokia{path}", headers=headers, params=params)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/plain;charset=utf-8"
    return answer.json()


async def test_a_queue_size_as_an_autoscaler_reads_it(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue", 3)
    got = await jolokia(api, admin_basic, "/read/org.apache.activemq:type=Broker,brokerName=localhost,"
                                          "destinationType=Queue,destinationName=orders/QueueSize")
    assert got["status"] == 200 and got["value"] == 3
    # the request echoed with the name in canonical form (keys sorted), as Jolokia does
    assert got["request"] == {"mbean": queue_bean("orders"), "attribute": "QueueSize", "type": "read"}
    assert isinstance(got["timestamp"], int)


async def test_every_attribute_of_a_queue_and_of_a_topic(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue", 2)
    await send(api, admin_basic, "prices?type=topic")
    queue = (await jolokia(api, admin_basic, f"/read/{queue_bean('orders')}"))["value"]
    assert queue["Name"] == "orders"
    assert [queue[n] for n in ("QueueSize", "EnqueueCount", "DequeueCount", "InFlightCount")] == [2, 2, 0, 0]
    assert queue["Paused"] is False and queue["DLQ"] is False and queue["ProducerCount"] == 0
    assert queue["MemoryUsageByteCount"] > 0
    topic = (await jolokia(api, admin_basic, f"/read/{queue_bean('prices', 'Topic')}"))["value"]
    assert topic["Name"] == "prices" and topic["QueueSize"] == 0  # ActiveMQ's: always 0 for a topic
    assert "Paused" not in topic  # a queue's attribute only, as ActiveMQ's TopicView


async def test_counts_follow_consumption(api, admin_basic):
    await send(api, admin_basic, "work?type=queue", 2)
    got = await api.get("/api/message/work?type=queue&readTimeout=1000", headers=admin_basic)
    assert got.status_code == 200
    value = await jolokia(api, admin_basic, f"/read/{queue_bean('work')}/QueueSize,DequeueCount,EnqueueCount")
    assert value["value"] == {"QueueSize": 1, "DequeueCount": 1, "EnqueueCount": 2}
    assert value["request"]["attribute"] == ["QueueSize", "DequeueCount", "EnqueueCount"]


async def test_a_pattern_reads_every_match_and_skips_what_a_bean_lacks(api, admin_basic):
    await send(api, admin_basic, "a.one?type=queue")
    await send(api, admin_basic, "a.two?type=queue", 2)
    await send(api, admin_basic, "b?type=topic")
    got = await jolokia(api, admin_basic, "/read/org.apache.activemq:type=Broker,brokerName=*,"
                                          "destinationType=Queue,destinationName=a.*/QueueSize,Nope")
    assert got["status"] == 200
    assert got["value"] == {queue_bean("a.one"): {"QueueSize": 1}, queue_bean("a.two"): {"QueueSize": 2}}
    everything = await jolokia(api, admin_basic, "/read/org.apache.activemq:*/QueueSize")
    # the broker has no QueueSize: left out of a pattern's answer, as Jolokia leaves it
    assert set(everything["value"]) == {queue_bean("a.one"), queue_bean("a.two"), queue_bean("b", "Topic")}


async def test_search_lists_names_and_a_property_list_pattern(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue")
    got = await jolokia(api, admin_basic, "/search/org.apache.activemq:type=Broker,*")
    assert sorted(got["value"]) == sorted([BROKER, HEALTH, queue_bean("orders")])
    assert got["request"] == {"mbean": "org.apache.activemq:type=Broker,*", "type": "search"}
    none = await jolokia(api, admin_basic, "/search/org.apache.activemq:type=Broker,brokerName=localhost,"
                                           "destinationType=Queue,destinationName=zzz*")
    assert none["value"] == [] and none["status"] == 200


async def test_the_broker_bean_totals_and_lists_destinations(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue", 2)
    await send(api, admin_basic, "prices?type=topic")
    value = (await jolokia(api, admin_basic, f"/read/{BROKER}"))["value"]
    assert value["BrokerName"] == "localhost"
    assert value["MemoryLimit"] > 0 and value["MemoryPercentUsage"] == 0  # (two small messages)
    assert value["TotalEnqueueCount"] >= 2 and value["TotalMessageCount"] == 2
    assert value["Queues"] == [{"objectName": queue_bean("orders")}]
    assert {"objectName": queue_bean("prices", "Topic")} in value["Topics"]
    inner = await jolokia(api, admin_basic, f"/read/{BROKER}/Queues/0/objectName")  # an inner path
    assert inner["value"] == queue_bean("orders") and inner["request"]["path"] == "0/objectName"


async def test_a_slash_in_a_name_is_escaped_in_the_path(api, admin_basic, make_user):
    await send(api, admin_basic, "x?type=queue&destination=a/b")
    got = await jolokia(api, admin_basic, f"/read/{queue_bean('a!/b')}/QueueSize")
    assert got["value"] == 1 and got["request"]["mbean"] == queue_bean("a/b")


async def test_names_encoded_as_activemq_encodes_them(api, admin_basic):
    # ActiveMQ's JMXSupport.encodeObjectNamePart: '=' -> &amp;, '?' -> &qe;, '*' -> &ast;, ':' ',' -> _
    await send(api, admin_basic, "x?type=queue&destination=" + "k%3Dv")
    await send(api, admin_basic, "x?type=queue&destination=" + "c%3Ad")
    search = await jolokia(api, admin_basic, "/search/org.apache.activemq:destinationType=Queue,*")
    assert sorted(search["value"]) == sorted([queue_bean("c_d"), queue_bean("k&amp;v")])
    assert (await jolokia(api, admin_basic, f"/read/{queue_bean('k&amp;v')}/QueueSize"))["value"] == 1
    # '_' stands for ':' or ',' (or '_'): the name designates whichever destinations it encodes
    assert (await jolokia(api, admin_basic, f"/read/{queue_bean('c_d')}/QueueSize"))["value"] == 1


async def test_errors_are_answered_with_status_200_and_jolokias_types(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue")
    unknown = await jolokia(api, admin_basic, f"/read/{queue_bean('orders')}/Nope")
    assert unknown["status"] == 404
    assert unknown["error_type"] == "javax.management.AttributeNotFoundException"
    assert unknown["error"] == "javax.management.AttributeNotFoundException : No such attribute: Nope"
    missing = await jolokia(api, admin_basic, f"/read/{queue_bean('missing')}")
    assert (missing["status"], missing["error_type"]) == (404, "javax.management.InstanceNotFoundException")
    malformed = await jolokia(api, admin_basic, "/read/notaname")
    assert malformed == {"error_type": "java.lang.IllegalArgumentException", "status": 400,
                         "error": "java.lang.IllegalArgumentException : Invalid object name. "
                                  "Key properties cannot be empty"}
    bad_type = await jolokia(api, admin_basic, "/bogus/x")
    assert bad_type["error"] == "java.lang.IllegalArgumentException : No type with name 'bogus' exists"
    nothing = await jolokia(api, admin_basic, "/read/org.apache.activemq:type=Broker,destinationName=zzz*,*")
    assert nothing["status"] == 404 and "No MBean with pattern" in nothing["error"]


async def test_exec_write_and_list_are_refused_and_change_nothing(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue")
    answer = await api.post("/api/jolokia", headers=admin_basic, json={
        "type": "exec", "mbean": queue_bean("orders"), "operation": "purge()"})
    refused = answer.json()
    assert refused["status"] == 403 and refused["error_type"] == "java.lang.SecurityException"
    assert "read-only" in refused["error"] and "/purge" in refused["error"]
    write = (await api.post("/api/jolokia", headers=admin_basic, json={
        "type": "write", "mbean": queue_bean("orders"), "attribute": "DLQ", "value": True})).json()
    assert write["status"] == 403
    assert (await jolokia(api, admin_basic, f"/read/{queue_bean('orders')}/QueueSize"))["value"] == 1


async def test_post_one_request_or_a_bulk_of_them(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue")
    one = (await api.post("/api/jolokia", headers=admin_basic, json={
        "type": "READ", "mbean": queue_bean("orders"), "attribute": "QueueSize"})).json()
    assert one["value"] == 1  # (the type in any case, as Jolokia takes it)
    bulk = (await api.post("/api/jolokia", headers=admin_basic, json=[
        {"type": "read", "mbean": queue_bean("orders"), "attribute": ["QueueSize"]},
        {"type": "search", "mbean": "org.apache.activemq:destinationType=Queue,*"},
        {"type": "read", "mbean": "x:y=z"}])).json()
    assert bulk[0]["value"] == {"QueueSize": 1} and bulk[0]["request"]["attribute"] == "QueueSize"
    assert bulk[1]["value"] == [queue_bean("orders")]
    assert (bulk[2]["status"], bulk[2]["request"]) == (404, {"mbean": "x:y=z", "type": "read"})
    # a request without a type fails the whole bulk, as Jolokia reads a bulk whole before answering
    untyped = (await api.post("/api/jolokia", headers=admin_basic, json=[
        {"type": "version"}, {"mbean": "x:y=z"}])).json()
    assert untyped == {"error_type": "java.lang.IllegalArgumentException", "status": 400,
                       "error": "java.lang.IllegalArgumentException : No type given"}
    garbage = await api.post("/api/jolokia", headers=admin_basic, content=b"not json")
    assert garbage.status_code == 200 and garbage.json()["status"] == 400
    assert (await api.post("/api/jolokia", headers=admin_basic, json=[])).json() == []


async def test_limits_say_their_names(api, admin_basic, settings):
    too_many = (await api.post("/api/jolokia", headers=admin_basic, json=[{"type": "version"}] * 101)).json()
    assert too_many["status"] == 400 and "MAX_REQUESTS" in too_many["error"]
    settings.SIGNALBOX_JOLOKIA_MAX_OBJECTS = 2
    from gateway.api import common
    common._settings_read.pop("SIGNALBOX_JOLOKIA_MAX_OBJECTS", None)
    try:
        for name in ("m1", "m2", "m3"):
            await send(api, admin_basic, f"{name}?type=queue")
        over = await jolokia(api, admin_basic, "/search/org.apache.activemq:destinationType=Queue,*")
        assert over["status"] == 400 and "SIGNALBOX_JOLOKIA_MAX_OBJECTS" in over["error"]
        # a name without a pattern is read whatever the limit
        assert (await jolokia(api, admin_basic, f"/read/{queue_bean('m3')}/QueueSize"))["value"] == 1
    finally:
        common._settings_read.pop("SIGNALBOX_JOLOKIA_MAX_OBJECTS", None)
    long = await jolokia(api, admin_basic, "/read/a:b=" + "x" * 5000)
    assert long["status"] == 400 and "MAX_OBJECT_NAME_LENGTH" in long["error"]


async def test_a_user_sees_the_destinations_they_may_read(api, admin_basic, make_user):
    await send(api, admin_basic, "orders.eu?type=queue", 2)
    await send(api, admin_basic, "secret?type=queue", 5)
    carol = await blocking(make_user)("carol", [("queue://orders.>", "read")])
    seen = await jolokia(api, carol, "/search/org.apache.activemq:destinationType=Queue,*")
    assert seen["value"] == [queue_bean("orders.eu")]
    refused = await jolokia(api, carol, f"/read/{queue_bean('secret')}/QueueSize")
    assert refused["status"] == 403 and refused["error_type"] == "java.lang.SecurityException"
    broker = (await jolokia(api, carol, f"/read/{BROKER}/TotalMessageCount,Queues"))["value"]
    assert broker == {"TotalMessageCount": 2, "Queues": [{"objectName": queue_bean("orders.eu")}]}


async def test_logging_in_is_required(api):
    answer = await api.get("/api/jolokia/version")
    assert answer.status_code == 401


async def test_version_and_the_json_mime_type(api, admin_basic):
    answer = await api.get("/api/jolokia", headers=admin_basic, params={"mimeType": "application/json"})
    assert answer.headers["content-type"] == "application/json;charset=utf-8"
    value = answer.json()["value"]
    assert value["protocol"] == "7.2" and value["info"]["product"] == "signalbox"


async def test_the_health_bean_worries_about_what_healthz_finds_failing(api, admin_basic, settings):
    settings.HEALTH_CHECK_TIMEOUT = 0.5
    # the test's namespace never had a maintenance tick: /healthz would say 503
    got = await jolokia(api, admin_basic, f"/read/{HEALTH}/CurrentStatus")
    status = got["value"]
    assert status.startswith("Getting Worried {") and status.endswith(" }")
    assert "signalbox.maintenance: ERROR" in status and "from maintenance" in status
    assert "signalbox.redis" not in status and "signalbox.database" not in status


def test_health_is_good_when_nothing_fails_and_worries_near_the_store_limit():
    ok = {name: {"status": "ok"} for name in ("redis", "database", "celery", "maintenance")}
    assert mbeans.health_attributes(ok, 100, 0) == {"CurrentStatus": "Good"}  # (no maxmemory: no limit)
    assert mbeans.health_attributes(ok, 90, 100) == {"CurrentStatus": "Good"}
    assert mbeans.health_attributes(ok, 95, 100) == {"CurrentStatus": (
        "Getting Worried {org.apache.activemq.StoreLimit: WARNING Message Store size is within 95% of its "
        "limit from redis ,  }")}


async def test_a_malformed_post_body_is_a_jolokia_error_not_a_crash(api, admin_basic):
    # (the project's JSON limits, gateway/api/json_input.py: a deep nesting raised RecursionError, a 500)
    for body, says in ((b"[" * 100_000 + b"]" * 100_000, "MAX_JSON_DEPTH"), (b"1e999999", ""),
                       (b'{"type": "read", "mbean": "\\ud800:a=b"}', "surrogate"), (b"\xff\xfe", "")):
        answer = await api.post("/api/jolokia", headers=admin_basic, content=body)
        assert answer.status_code == 200, body[:20]
        assert answer.json()["status"] == 400 and says in answer.json()["error"]


async def test_a_search_for_a_name_that_designates_nothing_finds_nothing(api, admin_basic):
    # (ActiveMQ's agent: an empty list; the view listed the name of a destination that does not exist)
    got = await jolokia(api, admin_basic, f"/search/{queue_bean('nosuch')}")
    assert (got["status"], got["value"]) == (200, [])
    await send(api, admin_basic, "there?type=queue")
    there = await jolokia(api, admin_basic, f"/search/{queue_bean('there')}")
    assert there["value"] == [queue_bean("there")]


async def test_the_object_limit_holds_for_a_whole_post(api, admin_basic, settings):
    # (each of a bulk's 100 requests under the limit: 100 pattern reads of 5,000 queues made 227 MB in 47 s)
    settings.SIGNALBOX_JOLOKIA_MAX_OBJECTS = 3
    from gateway.api import common
    common._settings_read.pop("SIGNALBOX_JOLOKIA_MAX_OBJECTS", None)
    try:
        for name in ("m1", "m2"):
            await send(api, admin_basic, f"{name}?type=queue")
        pattern = {"type": "search", "mbean": "org.apache.activemq:destinationType=Queue,*"}
        one = (await api.post("/api/jolokia", headers=admin_basic, json=[pattern])).json()
        assert one[0]["status"] == 200 and len(one[0]["value"]) == 2
        two = (await api.post("/api/jolokia", headers=admin_basic, json=[pattern, pattern])).json()
        assert two[0]["status"] == 200
        assert two[1]["status"] == 400 and "SIGNALBOX_JOLOKIA_MAX_OBJECTS" in two[1]["error"]
        # the broker's lists name destinations too: they count
        broker = {"type": "read", "mbean": BROKER}
        reads = (await api.post("/api/jolokia", headers=admin_basic, json=[broker, broker])).json()
        assert reads[0]["status"] == 200 and reads[1]["status"] == 400
    finally:
        common._settings_read.pop("SIGNALBOX_JOLOKIA_MAX_OBJECTS", None)


async def test_percent_escapes_in_the_get_path_are_decoded_as_the_servlet_decodes_them(api, admin_basic):
    # (the gateway routes on a path keeping %2F and %25 encoded, gateway/paths.py; Jolokia splits the
    # decoded path: `%25` is a `%`, `%2F` a `/`, a separator unless after `!`)
    await send(api, admin_basic, "x?type=queue&destination=50%25")
    await send(api, admin_basic, "x?type=queue&destination=a/b", 2)
    assert (await jolokia(api, admin_basic, f"/read/{queue_bean('50%25')}/QueueSize"))["value"] == 1
    assert (await jolokia(api, admin_basic, f"/read/{queue_bean('a!%2Fb')}/QueueSize"))["value"] == 2
    split = await jolokia(api, admin_basic, "/read/org.apache.activemq:type=Broker,brokerName=localhost,"
                                            "destinationType=Queue,destinationName=a%2Fb/QueueSize")
    assert split["request"]["attribute"] == "b" and split["request"]["path"] == "QueueSize"


async def test_an_inner_path_index_is_read_as_java_reads_it(api, admin_basic):
    await send(api, admin_basic, "orders?type=queue")
    queues = f"/read/{BROKER}/Queues"
    assert (await jolokia(api, admin_basic, f"{queues}/00"))["value"] == {"objectName": queue_bean("orders")}
    for step in ("-1", "x", "1", "%C2%B2"):  # ('²' is a digit to str.isdigit, not to int(): was a 500)
        assert (await jolokia(api, admin_basic, f"{queues}/{step}"))["value"] is None, step


async def test_a_quoted_value_is_another_name_than_the_unquoted_one(api, admin_basic):
    # (JMX's: brokerName="localhost" is not brokerName=localhost; ActiveMQ's agent answers 404 and [])
    await send(api, admin_basic, "orders?type=queue")
    for mbean in ('org.apache.activemq:type=Broker,brokerName="localhost"',
                  'org.apache.activemq:type=Broker,brokerName=localhost,destinationType=Queue,'
                  'destinationName="orders"'):
        got = (await api.post("/api/jolokia", headers=admin_basic, json={"type": "read", "mbean": mbean}))
        assert got.json()["status"] == 404
        assert got.json()["error_type"] == "javax.management.InstanceNotFoundException"
        found = (await api.post("/api/jolokia", headers=admin_basic, json={"type": "search", "mbean": mbean}))
        assert found.json()["value"] == []


async def test_inner_paths_with_wildcards_and_on_pattern_reads(api, admin_basic):
    # (Jolokia's, checked against ActiveMQ's agent: a pattern read's path starts at the MBean names; `*`
    # stands for every key or element, those the rest of the path finds nothing in left out)
    await send(api, admin_basic, "p.one?type=queue")
    await send(api, admin_basic, "p.two?type=queue", 2)

    async def read(mbean, path, attribute=None):
        request = {"type": "read", "mbean": mbean, "path": path}
        if attribute is not None:
            request["attribute"] = attribute
        return (await api.post("/api/jolokia", headers=admin_basic, json=request)).json()

    pattern = "org.apache.activemq:type=Broker,destinationName=p.*,*"
    sizes = await read(pattern, "*/QueueSize", "QueueSize")
    assert sizes["value"] == {queue_bean("p.one"): 1, queue_bean("p.two"): 2}
    names = await read(pattern, "*/Name")
    assert names["value"] == {queue_bean("p.one"): "p.one", queue_bean("p.two"): "p.two"}
    one = await read(pattern, queue_bean("p.one").replace("/", "!/"), "QueueSize")
    assert one["value"] == {"QueueSize": 1}
    assert (await read(pattern, "x/y", "QueueSize"))["value"] is None
    assert (await read(pattern, "*/*/x", ["QueueSize", "Name"]))["value"] is None
    names = await read(BROKER, "*/objectName", "Queues")
    assert sorted(names["value"]) == [queue_bean("p.one"), queue_bean("p.two")]
    first = (await read(BROKER, "*/0"))["value"]
    assert first["Queues"] in ({"objectName": queue_bean("p.one")}, {"objectName": queue_bean("p.two")})
    assert "Topics" not in first  # (none: nothing at index 0, left out)
    ending = await read(BROKER, "Queues/*")
    assert ending["status"] == 400
    assert ending["error"] == ("java.lang.IllegalArgumentException : Path 'Queues/*' must not end with a "
                               "wildcard")
    assert "path" not in (await read(BROKER, "", "BrokerName"))["request"]  # (an empty path is none)


async def test_a_bulk_with_an_unknown_type_fails_whole(api, admin_basic):
    # (ActiveMQ's agent builds every request of a bulk first: one of an unknown type fails them all)
    answer = (await api.post("/api/jolokia", headers=admin_basic, json=[
        {"type": "read", "mbean": "x:y=z"}, {"type": "bogus"}])).json()
    assert answer == {"error_type": "java.lang.IllegalArgumentException", "status": 400,
                      "error": "java.lang.IllegalArgumentException : No type with name 'bogus' exists"}


async def test_what_a_user_may_not_read_answers_as_what_does_not_exist(api, admin_basic, make_user):
    # names holding `_` (several destinations each), another connection's temporary queue: a user without
    # read permission learns nothing from the errors, the searches or the broker's lists and totals
    from gateway import runtime

    await send(api, admin_basic, "x?type=queue&destination=sec%3Ax", 3)
    await runtime.async_broker().ensure_destination("temp-queue://ID:tcp-00000000000000c1:1")
    await send(api, admin_basic, "orders.eu?type=queue")
    carol = await blocking(make_user)("carol", [("queue://orders.>", "read")])
    temp = "org.apache.activemq:brokerName=localhost,destinationName={},destinationType=TempQueue,type=Broker"

    async def error(mbean):
        got = await jolokia(api, carol, f"/read/{mbean}/QueueSize")
        return got["status"], got["error"].replace(mbean, "<name>")

    assert await error(queue_bean("sec_x")) == await error(queue_bean("sec_y")) == (
        404, "javax.management.InstanceNotFoundException : <name>")
    other, missing = temp.format("ID_tcp-00000000000000c1_1"), temp.format("ID_tcp-00000000000000c9_9")
    assert await error(other) == await error(missing)
    for pattern in ("org.apache.activemq:*", "org.apache.activemq:destinationName=sec*,*",
                    "org.apache.activemq:destinationType=TempQueue,*"):
        found = (await jolokia(api, carol, f"/search/{pattern}"))["value"]
        assert set(found) <= {BROKER, HEALTH, queue_bean("orders.eu")}, pattern
    broker = (await jolokia(api, carol, f"/read/{BROKER}"))["value"]
    assert broker["TemporaryQueues"] == [] and broker["Queues"] == [{"objectName": queue_bean("orders.eu")}]
    assert broker["TotalMessageCount"] == 1 and broker["TotalEnqueueCount"] == 1
    # one who may read every queue sees the temporary one, as GET /api/v1/queues lists it
    everyone = (await jolokia(api, admin_basic, f"/read/{BROKER}/TemporaryQueues"))["value"]
    assert everyone == [{"objectName": other}]


async def test_a_read_or_search_without_a_name_says_what_activemqs_agent_says(api, admin_basic):
    for path, says in (("/read", "Invalid arguments in pathinfo /read for command READ"),
                       ("/search/", "Invalid arguments in pathinfo /search/ for command SEARCH")):
        got = await jolokia(api, admin_basic, path)
        assert got == {"error_type": "java.lang.IllegalArgumentException", "status": 400,
                       "error": f"java.lang.IllegalArgumentException : {says}"}
    posted = (await api.post("/api/jolokia", headers=admin_basic, json={"type": "read"})).json()
    assert posted["error"] == "java.lang.IllegalArgumentException : Objectname can not be null"


async def test_a_long_attribute_list_costs_once_not_once_per_mbean(api, admin_basic):
    # (a POST's attribute list was walked for every MBean a pattern matched: 100,000 names over a few
    # hundred queues were tens of millions of steps)
    import time

    from gateway import runtime

    for i in range(300):
        await runtime.async_broker().ensure_destination(f"queue://many.q{i}")
    async def read(names):
        started = time.perf_counter()
        got = (await api.post("/api/jolokia", headers=admin_basic, json={
            "type": "read", "mbean": "org.apache.activemq:destinationName=many.*,*",
            "attribute": names})).json()
        assert len(got["value"]) == 300 and got["value"][queue_bean("many.q7")] == {"QueueSize": 0}
        return time.perf_counter() - started

    await read(["QueueSize"])  # (the login's password hash, once)
    plain = await read(["QueueSize"])
    assert await read([f"A{i}" for i in range(100_000)] + ["QueueSize"]) < plain + 0.6  # (was + 1.5 s)


async def test_a_name_holding_an_encoding_designates_the_destination_written_so_too(api, admin_basic):
    # ('&amp;' is how ActiveMQ writes '=', and also the name of a queue called 'k&amp;v': both are the
    # MBean named k&amp;v, as `_` stands for several characters)
    await send(api, admin_basic, "x?type=queue&destination=" + "k%26amp%3Bv", 2)
    got = await jolokia(api, admin_basic, f"/read/{queue_bean('k&amp;v')}/QueueSize")
    assert got["value"] == 2


async def test_a_long_scan_lets_the_other_requests_of_the_process_run(api, admin_basic):
    # (a bulk of pattern searches matched names without ever giving the event loop back: the process's
    # other HTTP and WebSocket clients waited for all of it, 1 s here)
    import asyncio
    import time

    from gateway import runtime

    for i in range(1000):
        await runtime.async_broker().ensure_destination(f"queue://scan.q{i}.{'a' * 60}")
    await jolokia(api, admin_basic, "/version")  # (the login's password hash, once)
    pattern = "org.apache.activemq:destinationName=" + "*?" * 200 + "*,*"  # (70 parts tried per name)
    bulk = [{"type": "search", "mbean": pattern}] * 40
    gaps: list[float] = []

    async def watch(done: asyncio.Event) -> None:  # how long the loop went without running this
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            gaps.append(time.perf_counter() - before)

    done = asyncio.Event()
    watcher = asyncio.ensure_future(watch(done))
    started = time.perf_counter()
    answer = await api.post("/api/jolokia", headers=admin_basic, json=bulk)
    whole = time.perf_counter() - started
    done.set()
    await watcher
    assert answer.json()[0]["value"] == [] and whole > 0.3  # (long enough to show)
    assert max(gaps) < 0.1


async def test_no_get_path_or_post_body_makes_a_crash(api, admin_basic):
    # (a fuzz through the ASGI app: every answer Jolokia's JSON, never a 500; it found the deep nesting
    # and the '²' index above)
    import json
    import random
    from urllib.parse import quote

    await send(api, admin_basic, "orders?type=queue")
    rnd = random.Random(27)
    pieces = [*'ab:,=*?"\\\n!/ %é²١0-_&;', "%2F", "%25", "org.apache.activemq", "type=Broker",
              "brokerName=localhost", "destinationType=Queue", "destinationName=", "Queues", "QueueSize",
              "&amp;", "!/", "!!", "*/"]
    starts = ["read/", "search/", "", "list/", "read/org.apache.activemq:",
              f"read/{queue_bean('orders')}/", f"read/{BROKER}/Queues/"]
    for _ in range(400):
        path = rnd.choice(starts) + "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 10)))
        answer = await api.get("/api/jolokia/" + quote(path, safe="/:,=*!%&;"), headers=admin_basic)
        assert answer.status_code == 200 and "status" in answer.json(), path
    values = [None, 1, 1.5, True, "", "x", [], {}, ["a"], [1], {"a": 1}, "org.apache.activemq:*", "a:b=c",
              BROKER, "QueueSize", ["QueueSize", 2], "Queues", "0/objectName", "²", "*", "*/*", "a!/b",
              "read"]
    keys = ["type", "mbean", "attribute", "path", "config", "operation", "arguments", "value"]
    for _ in range(400):
        request = {k: rnd.choice(values) for k in rnd.sample(keys, rnd.randint(0, 5))}
        if rnd.random() < 0.7:
            request["type"] = rnd.choice(["read", "search", "version", "READ", "list", 3, None])
        body = rnd.choice([request, [request], [request, request], "x", 3, None, [None], [[request]]])
        answer = await api.post("/api/jolokia", headers=admin_basic, content=json.dumps(body))
        assert answer.status_code == 200, body
        answer.json()


async def test_a_get_inner_path_keeps_its_escapes(api, admin_basic):
    # (ActiveMQ's agent: the path echoed as written, `!/` a `/` inside one key; a MBean name holding a `/`
    # is a key of a pattern read's answer)
    await send(api, admin_basic, "x?type=queue&destination=esc/y!", 2)
    got = await jolokia(api, admin_basic, "/read/org.apache.activemq:type=Broker,destinationName=esc*,*/"
                                          "QueueSize/org.apache.activemq:brokerName=localhost,"
                                          "destinationName=esc!/y!!,destinationType=Queue,type=Broker")
    assert got["value"] == {"QueueSize": 2}
    assert got["request"]["path"] == ("org.apache.activemq:brokerName=localhost,destinationName=esc!/y!!,"
                                      "destinationType=Queue,type=Broker")
    echoed = await jolokia(api, admin_basic, f"/read/{BROKER}/BrokerName/a!/b!!c/d")
    assert echoed["request"]["path"] == "a!/b!!c/d" and echoed["value"] is None


async def test_a_read_of_one_named_destination_asks_its_counters_once(api, admin_basic, monkeypatch):
    # (its name was looked up to know it exists, then its counters asked again for the answer)
    from broker_core.broker import AsyncBroker

    await send(api, admin_basic, "once?type=queue", 2)
    asked: list[int] = []
    summaries = AsyncBroker.summaries

    async def counted(self, destinations, *args, **kwargs):
        asked.append(len(destinations))
        return await summaries(self, destinations, *args, **kwargs)

    monkeypatch.setattr(AsyncBroker, "summaries", counted)
    got = await jolokia(api, admin_basic, f"/read/{queue_bean('once')}/QueueSize")
    assert got["value"] == 2 and asked == [1]


async def test_the_broker_bean_reads_the_statistics_index_once(api, admin_basic, monkeypatch):
    # (its totals read the index, then its lists read it again: two look-ups that could each find a
    # different index)
    from gateway.api import destination_index
    from gateway.api import jolokia as view

    await send(api, admin_basic, "counted?type=queue")
    reads: list[str] = []
    index = destination_index.index

    async def counted(broker, *args, **kwargs):
        reads.append(broker.namespace)
        return await index(broker, *args, **kwargs)

    monkeypatch.setattr(destination_index, "index", counted)
    monkeypatch.setattr(view, "index", counted)
    got = await jolokia(api, admin_basic, f"/read/{BROKER}/TotalMessageCount,Queues")
    assert got["value"] == {"TotalMessageCount": 1, "Queues": [{"objectName": queue_bean("counted")}]}
    assert len(reads) == 1


# What Metricbeat's ActiveMQ module (its `broker` metricset: a Jolokia read of these attributes of the
# pattern org.apache.activemq:brokerName=*,type=Broker) asks of every broker
METRICBEAT_BROKER = ("BrokerName", "MemoryPercentUsage", "StorePercentUsage", "TempPercentUsage",
                     "TotalConnectionsCount", "TotalConsumerCount", "TotalDequeueCount", "TotalEnqueueCount",
                     "TotalMessageCount", "TotalProducerCount")


async def test_the_broker_bean_answers_what_metricbeat_reads_connections_and_the_store(api, admin_basic):
    from broker_core.connections import ConnectionRecord
    from gateway import runtime

    broker = runtime.async_broker()
    before = (await jolokia(api, admin_basic, f"/read/{BROKER}"))["value"]
    for n in range(2):  # two connections made, one gone since
        await broker.connection_put(ConnectionRecord(f"jolokia-conn-{n}", "stomp+tcp", "p1", user="amq"))
    await broker.connection_drop(["jolokia-conn-0"])
    got = await jolokia(api, admin_basic, "/read/org.apache.activemq:brokerName=*,type=Broker/"
                                          + ",".join(METRICBEAT_BROKER))
    value = got["value"][BROKER]
    assert sorted(value) == sorted(METRICBEAT_BROKER)  # every one of them (a pattern leaves out the missing)
    assert value["TotalConnectionsCount"] == before["TotalConnectionsCount"] + 2  # made since the start
    after = (await jolokia(api, admin_basic, f"/read/{BROKER}"))["value"]
    assert after["CurrentConnectionsCount"] == before["CurrentConnectionsCount"] + 1  # registered now
    assert value["TotalProducerCount"] == 0 and value["TempPercentUsage"] == 0
    await broker.connection_drop(["jolokia-conn-1"])
    # the store is Redis: its used memory against maxmemory (0, none: 0 %)
    redis = runtime.async_redis()
    kept = (await redis.config_get("maxmemory"))["maxmemory"]
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", used * 4)  # about 25 % used (the test writes little meanwhile)
    try:
        store = (await jolokia(api, admin_basic, f"/read/{BROKER}/StoreLimit,StorePercentUsage"))["value"]
    finally:
        await redis.config_set("maxmemory", kept)
    assert store["StoreLimit"] == used * 4 and 20 <= store["StorePercentUsage"] <= 30, store


async def test_a_destination_s_memory_limit_in_force_and_its_percent_as_metricbeat_reads_them(api,
                                                                                              admin_basic):
    """Metricbeat's queue and topic metricsets read MemoryPercentUsage: the destination's bytes against the
    limit in force, its own memoryLimit or else the broker's (ActiveMQ's child MemoryUsage)."""
    from gateway import runtime

    await send(api, admin_basic, "bounded?type=queue")
    await send(api, admin_basic, "free?type=queue")
    from django.contrib.auth.models import User

    token = await blocking(lambda: token_headers(User.objects.get(username="amq")))()
    policy = "/api/v1/policies/queue/bounded"
    assert (await api.put(policy, json={"attributes": {"memoryLimit": 1000}}, headers=token)).is_success
    try:
        got = await jolokia(api, admin_basic, "/read/org.apache.activemq:brokerName=*,destinationName=*,"
                                              "destinationType=Queue,type=Broker/MemoryLimit,"
                                              "MemoryPercentUsage,MemoryUsageByteCount")
        bounded, free = got["value"][queue_bean("bounded")], got["value"][queue_bean("free")]
        assert bounded["MemoryLimit"] == 1000
        assert bounded["MemoryPercentUsage"] == bounded["MemoryUsageByteCount"] * 100 // 1000 > 0
        broker_limit = (await runtime.async_broker().memory()).limit
        assert free["MemoryLimit"] == broker_limit and free["MemoryPercentUsage"] == 0
    finally:
        await api.delete(policy, headers=token)


SIZES = ("AverageMessageSize", "MinMessageSize", "MaxMessageSize")


async def amq_token(api):
    from django.contrib.auth.models import User

    return await blocking(lambda: token_headers(User.objects.get(username="amq")))()


async def sizes_of(api, headers, bean: str) -> dict[str, int]:
    got = await jolokia(api, headers, f"/read/{bean}/" + ",".join(SIZES))
    assert got["status"] == 200, got
    return got["value"]


async def test_message_sizes_as_metricbeat_reads_them(api, admin_basic):
    """ActiveMQ's messageSize statistic (DestinationView's AverageMessageSize, MinMessageSize,
    MaxMessageSize: longs): every message the destination counts enqueued adds its size, the size its memory
    usage counts (packed bytes, at least minimumMessageSize, 1,024 by default); the average's fraction is
    dropped, as ActiveMQ's cast to long drops it."""
    one = {"body": "x" * 3000}
    token = await amq_token(api)
    await api.post("/api/v1/queues/probe/messages", json={"messages": [one]}, headers=token)
    probe = await sizes_of(api, admin_basic, queue_bean("probe"))
    overhead = probe["MaxMessageSize"] - 3000  # what a message packs beside its body
    assert probe == {"AverageMessageSize": 3000 + overhead, "MinMessageSize": 3000 + overhead,
                     "MaxMessageSize": 3000 + overhead} and 0 < overhead < 200
    sent = await api.post("/api/v1/queues/sized/messages", headers=token, json={"messages": [
        {"body": "small"}, one, {"body": "y" * 6000}]})
    assert sent.status_code == 201, sent.text
    expected_average = (1024 + 3000 + 6000 + 2 * overhead) // 3
    assert await sizes_of(api, admin_basic, queue_bean("sized")) == {
        "AverageMessageSize": expected_average, "MinMessageSize": 1024, "MaxMessageSize": 6000 + overhead}
    # consumed, they stay counted (a figure of what passed through, as ActiveMQ's)
    got = await api.get("/api/message/sized?type=queue&readTimeout=1000", headers=admin_basic)
    assert got.status_code == 200
    assert (await sizes_of(api, admin_basic, queue_bean("sized")))["MaxMessageSize"] == 6000 + overhead
    # a topic counts each message it is sent, subscribed to or not (Topic.dispatch counts before matching)
    published = await api.post("/api/v1/topics/sizes.t/messages", headers=token, json={"messages": [
        one, {"body": "z" * 5000}]})
    assert published.status_code == 201, published.text
    assert await sizes_of(api, admin_basic, queue_bean("sizes.t", "Topic")) == {
        "AverageMessageSize": 4000 + overhead, "MinMessageSize": 3000 + overhead,
        "MaxMessageSize": 5000 + overhead}
    # the broker's: over every destination the user may read (ActiveMQ's destinations add theirs to it)
    broker = await sizes_of(api, admin_basic, BROKER)
    assert broker == {"AverageMessageSize": (1024 + 3 * 3000 + 6000 + 5000 + 5 * overhead) // 6,
                      "MinMessageSize": 1024, "MaxMessageSize": 6000 + overhead}


async def test_what_a_message_size_counts_and_what_it_does_not(api, admin_basic):
    """As ActiveMQ counts a message's size where it counts it enqueued: a message expired on arrival is
    neither (Queue.send drops it before messageSent), a delayed one counts when it reaches the queue (the
    scheduler sends it then), and one moved to the dead-letter queue counts there too, as a send to it."""
    token = await amq_token(api)
    empty = {"AverageMessageSize": 0, "MinMessageSize": 0, "MaxMessageSize": 0}
    sent = await api.post("/api/v1/queues/what/messages", headers=token, json={"messages": [
        {"body": "e" * 2000, "expiration": 1}]})
    assert sent.json()["statuses"] == ["expired"], sent.text
    # (the queue exists: the send made it)
    assert await sizes_of(api, admin_basic, queue_bean("what")) == empty
    dead = await sizes_of(api, admin_basic, queue_bean("ActiveMQ.DLQ"))
    assert dead["MaxMessageSize"] > 2000  # the expired message went to the dead-letter queue: counted there
    sent = await api.post("/api/v1/queues/what/messages", headers=token, json={"messages": [
        {"body": "d" * 2500, "delay": 300}]})
    assert sent.status_code == 201, sent.text
    assert await sizes_of(api, admin_basic, queue_bean("what")) == empty  # not on the queue yet
    got = await api.get("/api/message/what?type=queue&readTimeout=3000", headers=admin_basic)
    assert got.status_code == 200 and got.text == "d" * 2500
    arrived = await sizes_of(api, admin_basic, queue_bean("what"))
    assert arrived["MinMessageSize"] == arrived["MaxMessageSize"] == arrived["AverageMessageSize"] > 2500


TIMES = ("AverageEnqueueTime", "MinEnqueueTime", "MaxEnqueueTime")


@pytest.fixture
def timed(redis_client, api_namespace, clock) -> Broker:
    """A broker on the API's namespace with the test's clock, so what waits, waits a known time."""
    return Broker(redis_client, api_namespace, clock)


async def times_of(api, headers, bean: str) -> dict[str, float]:
    got = await jolokia(api, headers, f"/read/{bean}/" + ",".join(TIMES))
    assert got["status"] == 200, got
    return got["value"]


def enqueue_times(average: float, least: int, most: int) -> dict[str, float]:
    return {"AverageEnqueueTime": average, "MinEnqueueTime": least, "MaxEnqueueTime": most}


async def test_enqueue_times_as_activemq_times_each_dispatch(api, admin_basic, timed, clock):
    """ActiveMQ's processTime statistic (DestinationView's AverageEnqueueTime, a double, MinEnqueueTime and
    MaxEnqueueTime, longs, ms): each dispatch adds the time since the message last reached the broker
    (RegionBroker.preProcessDispatch: now - brokerInTime); a redelivery counts again, from the send."""
    timed.send("timed", [Message(message_id="m1", body="a"), Message(message_id="m2", body="b")])
    assert await times_of(api, admin_basic, queue_bean("timed")) == enqueue_times(0, 0, 0)  # none yet
    clock.advance(400)
    c = timed.add_consumer("timed", ConsumerSpec(prefetch=1))
    assert [d.message_id for d in drain(timed, c)] == ["m1"]  # waited 400 ms
    clock.advance(600)
    timed.release(c, ["m1"])  # redelivered at once: 1,000 ms after its send
    assert [d.redelivery_count for d in drain(timed, c)] == [1]
    timed.ack(c, "m1")  # m2 takes its place: 1,000 ms
    assert await times_of(api, admin_basic, queue_bean("timed")) == enqueue_times(800.0, 400, 1000)
    rest = await api.get("/api/v1/queues/timed", headers=await amq_token(api))  # (the REST statistics)
    assert rest.json()["enqueue_times"] == {"count": 3, "total": 2400, "smallest": 400, "largest": 1000}
    # a dead letter's time starts again on the dead-letter queue: a send to it
    clock.advance(500)
    timed.nack(c, "m2", poison=True)
    timed.forward("timed")
    clock.advance(250)
    assert [d.message_id for d in drain(timed, timed.add_consumer("ActiveMQ.DLQ", ConsumerSpec()))] == ["m2"]
    assert await times_of(api, admin_basic, queue_bean("ActiveMQ.DLQ")) == enqueue_times(250.0, 250, 250)
    assert await times_of(api, admin_basic, queue_bean("timed")) == enqueue_times(800.0, 400, 1000)


async def test_a_scheduled_message_s_enqueue_time_starts_at_its_firing(api, admin_basic, timed, clock):
    """The scheduler sends a delayed message when it is due (SchedulerBroker.scheduledJob): its time is
    measured from then, not from the producer's send."""
    timed.send("later", Message(body="later", delay_ms=2_000))
    clock.advance(2_000)
    timed.send("later", Message(body="now"))  # (its call fires the delayed one: both reach the queue now)
    clock.advance(300)
    got = drain(timed, timed.add_consumer("later", ConsumerSpec()))
    assert sorted(d.body for d in got) == ["later", "now"]
    assert await times_of(api, admin_basic, queue_bean("later")) == enqueue_times(300.0, 300, 300)


async def test_a_topic_counts_each_subscriber_s_dispatch(api, admin_basic, timed, clock):
    """Each subscription's dispatch counts on the topic. MinEnqueueTime is TimeStatisticImpl's: a time
    replaces the smallest when it is smaller or the smallest is 0, so a 0 holds only until the next time."""
    one = timed.add_consumer("topic://ticks", ConsumerSpec(prefetch=1))
    timed.send("topic://ticks", [Message(message_id="m1", body="a"), Message(message_id="m2", body="b")])
    clock.advance(50)
    assert [d.message_id for d in drain(timed, one)] == ["m1"]  # dispatched at the send: 0
    timed.ack(one, "m1")  # m2, 50 ms after its send
    assert await times_of(api, admin_basic, queue_bean("ticks", "Topic")) == enqueue_times(25.0, 50, 50)
    # the broker MBean has none (ActiveMQ's BrokerView serves no enqueue time)
    got = await jolokia(api, admin_basic, f"/read/{BROKER}/AverageEnqueueTime")
    assert got["status"] == 404 and got["error_type"] == "javax.management.AttributeNotFoundException"
