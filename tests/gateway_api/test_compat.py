"""ActiveMQ's REST MessageServlet at /api/message (spec §15.1): its request sequences get its answers."""

from __future__ import annotations

import asyncio
import base64

import pytest

from tests.gateway_api.mixins import assert_problem, blocking

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def basic(make_user):
    """ActiveMQ clients log in with HTTP Basic (the anchor uses admin/admin)."""
    make_user("amq", [("queue://>", "admin"), ("topic://>", "admin")])
    return {"Authorization": "Basic " + base64.b64encode(b"amq:pw").decode()}


async def test_post_then_get_round_trips_a_text_message(api, basic):
    sent = await api.post("/api/message/orders/eu?type=queue", content="hello", headers=basic)
    assert sent.status_code == 200 and sent.text == "Message sent"
    assert sent.headers["messageID"].startswith("ID:")
    got = await api.get("/api/message/orders/eu?type=queue&readTimeout=1000", headers=basic)
    assert got.status_code == 200 and got.text == "hello"
    assert got.headers["destination"] == "queue://orders.eu"
    assert got.headers["id"] == sent.headers["messageID"]
    assert got.headers["content-type"] == "text/plain;charset=utf-8"
    assert got.headers["cache-control"] == "no-cache, no-store, must-revalidate"
    assert got.headers["expires"] == "Thu, 01 Jan 1970 00:00:00 GMT"


async def test_parameters_become_headers_properties_and_groups(api, basic):
    await api.post("/api/message/orders.eu", params={
        "type": "queue", "body": "<?xml version='1.0'?><order/>", "JMSCorrelationID": "c1", "JMSType": "t",
        "JMSXGroupID": "cart", "JMSXGroupSeq": "1", "region": "eu", "JMSTimeToLive": "60000"}, headers=basic)
    got = await api.get("/api/message/orders.eu", params={"type": "queue", "readTimeout": "1000"},
                        headers=basic)
    assert got.text == "<order/>"  # the prolog is removed
    assert got.headers["content-type"] == "application/xml;charset=utf-8"  # the text starts with '<'
    assert got.headers["region"] == "eu" and got.headers["JMSXGroupID"] == "cart"
    assert "JMSCorrelationID" not in got.headers  # a header field, not a property


async def test_priority_defaults_to_5_and_delivery_mode_to_persistent(api, basic, make_user):
    await api.post("/api/message/orders.eu?type=queue", content="x", headers=basic)
    await api.post("/api/message/orders.eu?type=queue&JMSDeliveryMode=nonpersistent&JMSPriority=9",
                   content="y", headers=basic)
    browse = (await api.get("/api/v1/queues/orders.eu/messages", headers=basic)).json()
    assert browse["detail"]  # the v1 API does not take Basic: it is ActiveMQ's servlet only
    root = await blocking(make_user)("root", superuser=True)
    messages = (await api.get("/api/v1/queues/orders.eu/messages", headers=root)).json()["messages"]
    assert [(m["priority"], m["persistent"]) for m in messages] == [(5, True), (9, False)]


async def test_priority_out_of_range_and_delivery_mode_are_read_as_activemq_reads_them(api, basic, make_user):
    """The servlet sends JMSPriority through JMS, whose (byte) cast and clamp make 12 a 9 and 130 a 0
    (not a refusal); it trims JMSDeliveryMode, so ' persistent ' is persistent. Past a Java int: refused."""
    for priority, mode in (("12", " persistent "), ("130", "NON_PERSISTENT"), ("-1", "Persistent")):
        params = {"type": "queue", "body": priority, "JMSPriority": priority, "JMSDeliveryMode": mode}
        sent = await api.post("/api/message/orders.eu", params=params, headers=basic)
        assert sent.status_code == 200, sent.text
    refused = await api.post("/api/message/orders.eu", params={
        "type": "queue", "body": "x", "JMSPriority": str(2**31)}, headers=basic)
    assert refused.status_code == 400 and refused.json()["parameter"] == "JMSPriority"
    root = await blocking(make_user)("root", superuser=True)
    messages = (await api.get("/api/v1/queues/orders.eu/messages", headers=root)).json()["messages"]
    assert sorted((m["priority"], m["persistent"]) for m in messages) == [(0, False), (0, True), (9, True)]


async def test_delivery_mode_is_trimmed_as_javas_string_trim_trims(api, basic, make_user):
    """The servlet reads JMSDeliveryMode with Java's String.trim, which takes off every character up to
    U+0020 (control characters too) and nothing else: a no-break space or an em space around `persistent`
    stays, so the message is not persistent; a U+0001 or U+001F around it goes, so it is."""
    modes = {"\u00a0persistent": False, "persistent\u2003": False, "\x01persistent\x1f": True,
             "\tpersistent\r\n": True}
    assert await persistence_by_delivery_mode(api, basic, make_user, list(modes)) == modes


async def persistence_by_delivery_mode(api, basic, make_user, modes: list[str]) -> dict[str, bool]:
    """Whether the message sent with each JMSDeliveryMode value (one message each) is persistent."""
    for mode in modes:
        sent = await api.post("/api/message/orders.eu", params={
            "type": "queue", "body": repr(mode), "JMSDeliveryMode": mode}, headers=basic)
        assert sent.status_code == 200, sent.text
    root = await blocking(make_user)("root", superuser=True)
    messages = (await api.get("/api/v1/queues/orders.eu/messages", headers=root)).json()["messages"]
    persistent = {m["body"]: m["persistent"] for m in messages}
    return {mode: persistent[repr(mode)] for mode in modes}


async def test_names_compare_as_javas_equals_ignore_case(api, basic, make_user):
    """The servlet compares JMSDeliveryMode, type, oneShot, xml and json with Java's equalsIgnoreCase,
    which matches character by character after upper- then lower-casing each: 'ſ' (long s) is an 's',
    'K' (Kelvin) a 'k', 'İ' an 'i', where comparing str.lower() texts sees none of them."""
    modes = {"perſistent": True, "PERSISTENT": True, "persiſtent\u0307": False}
    assert await persistence_by_delivery_mode(api, basic, make_user, list(modes)) == modes
    # type=topİc ('İ' upper-cased is itself, then lower-cased 'i') is a topic, as ActiveMQ reads it
    first = await api.get("/api/message/orders.kelvin", params={"type": "topİc", "readTimeout": "10",
                                                                "clientId": "k"}, headers=basic)
    assert first.status_code == 204  # (subscribed)
    await api.post("/api/message/orders.kelvin", params={"type": "topic", "body": "x"}, headers=basic)
    got = await api.get("/api/message/orders.kelvin", params={"type": "topİc", "readTimeout": "2000",
                                                              "clientId": "k"}, headers=basic)
    assert (got.status_code, got.headers["destination"]) == (200, "topic://orders.kelvin")


async def test_no_type_means_a_topic(api, basic):
    # a topic keeps nothing for subscribers that do not exist yet: the first GET subscribes (204), a
    # message sent then reaches the kept consumer's subscription, the next GET gets it
    first = await api.get("/api/message/orders.eu?readTimeout=10&clientId=c1", headers=basic)
    assert first.status_code == 204
    sent = await api.post("/api/message/orders.eu", content="to the topic", headers=basic)
    assert sent.status_code == 200
    got = await api.get("/api/message/orders.eu?readTimeout=2000&clientId=c1", headers=basic)
    assert (got.status_code, got.text, got.headers["destination"]) == (200, "to the topic",
                                                                        "topic://orders.eu")
    # the queue:// prefix wins over a missing type, and the destination parameter over the path
    sent = await api.post("/api/message", params={"destination": "queue://orders.eu"}, content="x",
                          headers=basic)
    assert sent.status_code == 200


async def test_an_empty_queue_answers_204_after_the_read_timeout(api, basic):
    loop = asyncio.get_running_loop()
    started = loop.time()
    got = await api.get("/api/message/orders.eu?type=queue&readTimeout=300", headers=basic)
    assert got.status_code == 204 and got.content == b""
    assert "content-type" not in got.headers and got.headers["expires"] == "Thu, 01 Jan 1970 00:00:00 GMT"
    assert 0.25 < loop.time() - started < 3


async def test_a_selector_header_counts_when_the_clients_consumer_is_created(api, basic):
    for region in ("eu", "us", "us"):
        await api.post(f"/api/message/orders.eu?type=queue&region={region}", content=region, headers=basic)
    first = await api.get("/api/message/orders.eu?type=queue&clientId=c1&readTimeout=500",
                          headers={**basic, "selector": "region = 'us'"})
    assert first.text == "us"
    # a later request's selector is ignored: the consumer exists already
    second = await api.get("/api/message/orders.eu?type=queue&clientId=c1&readTimeout=500",
                           headers={**basic, "selector": "region = 'eu'"})
    assert second.text == "us"


async def test_a_session_cookie_keeps_the_consumer_and_one_shot_closes_it(api, basic):
    await api.post("/api/message/orders.eu?type=queue", content="a", headers=basic)
    got = await api.get("/api/message/orders.eu?type=queue&readTimeout=500", headers=basic)
    assert "JSESSIONID" in got.headers["set-cookie"]
    again = await api.get("/api/message/orders.eu?type=queue&readTimeout=100", headers=basic)
    assert again.status_code == 204 and "set-cookie" not in again.headers  # same session, same consumer
    await api.get("/api/message/orders.eu?type=queue&readTimeout=100&oneShot=true", headers=basic)
    root_stats = await api.get("/api/message/orders.eu?type=queue&readTimeout=10&clientId=x", headers=basic)
    assert root_stats.status_code == 204


async def test_a_second_request_on_a_busy_consumer_is_refused(api, basic, make_user):
    watcher = await blocking(make_user)("watcher", [("queue://orders.>", "read")])
    url = "/api/message/orders.eu?type=queue&clientId=busy&readTimeout=30000"
    first = asyncio.create_task(api.get(url, headers=basic))
    try:
        # the first request waits on its consumer once the queue shows it (it took the consumer's turn
        # before making it): a fixed sleep was too short on a loaded machine
        for _ in range(200):
            stats = await api.get("/api/v1/queues/orders.eu", headers=watcher)
            if stats.status_code == 200 and stats.json()["consumer_count"] == 1:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the first request's consumer never showed: {stats.text}")
        second = await api.get(url, headers=basic)
        assert "Concurrent access to consumer is not supported" in assert_problem(second, 409)["detail"]
        await api.post("/api/message/orders.eu?type=queue", content="for the first", headers=basic)
    finally:  # never leave the first request running into the next test's event loop
        got = await first
    assert got.status_code == 200 and got.text == "for the first"


async def test_a_refusal_after_the_turn_was_taken_ends_the_turn(api, basic, monkeypatch):
    from broker_core import turns
    from broker_core.errors import InvalidConsumer

    url = "/api/message/orders.eu?type=queue&clientId=refused&readTimeout=10"
    await api.post("/api/message/orders.eu?type=queue", content="kept", headers=basic)
    original = turns.begin_turn_receiving

    async def refused(broker, consumer, turn_ms):  # receive.lua refusing once it holds the turn
        await turns.begin_turn(broker, consumer, turn_ms)
        raise InvalidConsumer("refused for the test")

    monkeypatch.setattr(turns, "begin_turn_receiving", refused)
    assert (await api.get(url, headers=basic)).status_code == 400
    monkeypatch.setattr(turns, "begin_turn_receiving", original)
    got = await api.get(url, headers=basic)  # not 409: the refused request ended its turn
    assert got.status_code == 200 and got.text == "kept"


async def test_unsubscribe_closes_the_clients_consumers(api, basic, make_user):
    await api.get("/api/message/orders.eu?type=queue&clientId=gone&readTimeout=10", headers=basic)
    root = await blocking(make_user)("root", superuser=True)
    assert (await api.get("/api/v1/queues/orders.eu", headers=root)).json()["consumer_count"] == 1
    response = await api.post("/api/message/orders.eu?action=unsubscribe&clientId=gone", headers=basic)
    assert response.status_code == 200
    assert (await api.get("/api/v1/queues/orders.eu", headers=root)).json()["consumer_count"] == 0


async def test_json_and_xml_parameters_choose_the_content_type(api, basic):
    for _ in range(2):
        await api.post("/api/message/orders.eu?type=queue", content='{"a": 1}', headers=basic)
    as_json = await api.get("/api/message/orders.eu?type=queue&json=true&readTimeout=500", headers=basic)
    as_xml = await api.get("/api/message/orders.eu?type=queue&xml=true&readTimeout=500", headers=basic)
    assert as_json.headers["content-type"] == "application/json"
    assert as_xml.headers["content-type"] == "application/xml;charset=utf-8"


@pytest.mark.parametrize(("setting", "answered", "encoding"), [
    ("text/html", "text/html;charset=utf-8", "utf-8"),
    ("Text/CSV; header=present", "Text/CSV; header=present;charset=utf-8", "utf-8"),
    ("application/atom+xml", "application/atom+xml;charset=utf-8", "utf-8"),
    ("text/html; charset=UTF-8", "text/html; charset=UTF-8", "utf-8"),
    ("text/plain; charset=ISO-8859-1", "text/plain; charset=ISO-8859-1", "latin-1"),
    ("application/octet-stream", "application/octet-stream", "utf-8"),
    ("text/plain; charset=no-such-charset", "text/plain;charset=utf-8", "utf-8"),  # (logged)
])
async def test_the_default_content_type_setting_names_the_bodys_charset(api, basic, settings, setting,
                                                                       answered, encoding):
    """SIGNALBOX_COMPAT_DEFAULT_CONTENT_TYPE: a text type (text/*, XML) is answered with charset=utf-8, the
    body's, unless the setting names a charset: then the body is in that one (what a client decodes it
    with), a character it lacks written '?', as ActiveMQ's Jetty writes it (one it does not know: UTF-8,
    and named). Other types go as set."""
    settings.SIGNALBOX_COMPAT_DEFAULT_CONTENT_TYPE = setting
    await api.post("/api/message/orders.eu?type=queue", content="déjà vu €".encode(), headers=basic)
    got = await api.get("/api/message/orders.eu?type=queue&readTimeout=1000", headers=basic)
    assert got.headers["content-type"] == answered
    assert got.content == "déjà vu €".encode(encoding, "replace")


async def test_scheduling_parameters_schedule_the_message_as_activemqs_servlet_does(api, basic):
    """ActiveMQ's servlet makes every other parameter a string property, and its SchedulerBroker schedules a
    message by its AMQ_SCHEDULED_* properties, converting a string (TypeConversionSupport): a delay
    parameter delays it, one of 0 makes a job delivered at once with scheduledJobId. broker_core reads those
    properties (Message.pack), so this adapter needs no rule of its own; one that is no number is refused,
    naming it, and nothing is sent."""
    sent = await api.post("/api/message/orders.eu?type=queue&AMQ_SCHEDULED_DELAY=0", content="now",
                          headers=basic)
    assert sent.status_code == 200, sent.text
    got = await api.get("/api/message/orders.eu?type=queue&readTimeout=1000", headers=basic)
    assert got.text == "now" and got.headers["scheduledJobId"] == sent.headers["messageID"]
    assert "AMQ_SCHEDULED_DELAY" not in got.headers  # (stripped when it fires, as ActiveMQ's)
    sent = await api.post("/api/message/orders.eu?type=queue&AMQ_SCHEDULED_DELAY=1500", content="later",
                          headers=basic)
    assert sent.status_code == 200, sent.text
    nothing = await api.get("/api/message/orders.eu?type=queue&readTimeout=300", headers=basic)
    assert nothing.status_code == 204
    got = await api.get("/api/message/orders.eu?type=queue&readTimeout=5000", headers=basic)
    assert got.text == "later" and got.headers["scheduledJobId"] == sent.headers["messageID"]
    bad = await api.post("/api/message/orders.eu?type=queue&AMQ_SCHEDULED_DELAY=soon", content="x",
                         headers=basic)
    assert "AMQ_SCHEDULED_DELAY" in assert_problem(bad, 400)["detail"]
    nothing = await api.get("/api/message/orders.eu?type=queue&readTimeout=300", headers=basic)
    assert nothing.status_code == 204


async def test_a_form_post_and_its_errors(api, basic):
    sent = await api.post("/api/message/orders.eu", data={"type": "queue", "body": "from a form"},
                          headers=basic)
    assert sent.status_code == 200
    got = await api.get("/api/message/orders.eu?type=queue&readTimeout=500", headers=basic)
    assert got.text == "from a form"
    too_big = await api.post("/api/message/orders.eu?type=queue", content="x" * 100_001, headers=basic)
    assert_problem(too_big, 413, "message_too_large")
    assert_problem(await api.post("/api/message/orders.eu?type=queue", content="x"), 401)
    wrong = {"Authorization": "Basic " + base64.b64encode(b"amq:wrong").decode()}
    assert_problem(await api.post("/api/message/orders.eu?type=queue", content="x", headers=wrong), 401)
    assert_problem(await api.post("/api/message/orders.eu?type=queue&JMSPriority=high", content="x",
                                  headers=basic), 400, "invalid_parameter")


async def test_the_servlet_checks_permissions_too(api, make_user):
    writer = await blocking(make_user)("writer", [("queue://orders.>", "write")])
    sent = await api.post("/api/message/orders.eu?type=queue", content="x", headers=writer)
    assert sent.status_code == 200
    response = await api.get("/api/message/orders.eu?type=queue&readTimeout=10", headers=writer)
    assert_problem(response, 403, "permission_denied")


async def test_a_raw_body_not_in_its_charset_is_refused_not_changed(api, basic, make_user):
    """Bytes that are not UTF-8 (no charset named) are refused, naming where, nothing sent: decoded with
    U+FFFD in their place, the message would be another text than the one sent. A body in the charset
    its Content-Type names is that text."""
    latin1 = "h\xe9llo".encode("latin-1")
    for content_type in ("text/plain", "text/plain; charset=utf-8"):
        refused = await api.post("/api/message/orders.eu?type=queue", content=latin1,
                                 headers={**basic, "Content-Type": content_type})
        assert_problem(refused, 400, "invalid_body")
        assert "UTF-8" in refused.json()["detail"] and "byte 1" in refused.json()["detail"]
    sent = await api.post("/api/message/orders.eu?type=queue", content=latin1,
                          headers={**basic, "Content-Type": "text/plain; charset=ISO-8859-1"})
    assert sent.status_code == 200, sent.text
    root = await blocking(make_user)("root", superuser=True)
    messages = (await api.get("/api/v1/queues/orders.eu/messages", headers=root)).json()["messages"]
    assert [m["body"] for m in messages] == ["h\xe9llo"]
