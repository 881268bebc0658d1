"""ActiveMQ's web console XML feeds at /admin/xml/queues.jsp, topics.jsp and subscribers.jsp (docs/api.md,
"ActiveMQ's web console XML"): what Telegraf's `activemq` input reads (its `webadmin` path, `admin` by
default), and scripts written against ActiveMQ's console.

The elements and attributes are those ActiveMQ 5.17.2's JSPs write (activemq-web-console's
webapp/xml/*.jsp), with their quirks: a topic's `name` attribute ends with a space (its JSP writes one after
the name, and Telegraf, which trims a queue's name, keeps a topic's as it comes), a subscriber's `active`
is `yes` or `no`. Values are escaped as JSTL's `c:out` escapes them. A queue's `<feed>` (links to RSS feeds
of its messages, which Signalbox does not serve) is left out.

The queues and topics come from the statistics index (gateway/api/destination_index.py: every destination's
counters, at most a few seconds old, read in bounded calls), the subscribers from the durable subscription
registry, a page at a time, each subscription's counters by the broker's `subscriptions` of its topic. Only
destinations the user may read are listed (the REST API's permissions); at most
SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS subscriptions are read for one subscribers.jsp (past it, the answer
is refused with that name rather than cut short)."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape as xml_escape

from django.http import Http404, HttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.request import Request

from broker_core.destinations import Destination
from gateway import permissions, runtime
from gateway.api.auth import BasicAuthentication, TokenAuthentication
from gateway.api.base import GatewayView
from gateway.api.common import setting
from gateway.api.destination_index import FIELDS, index, parse_destination
from gateway.api.schema import problems
from gateway.db_steps import db

CONTENT_TYPE = "text/xml;charset=utf-8"
SIZE, CONSUMERS, ENQUEUED, DEQUEUED = (FIELDS.index(f) for f in ("queue_size", "consumer_count", "enqueued",
                                                                  "dequeued"))
DURABLES_PAGE = 500  # registry entries read per HSCAN


# JSTL's c:out escapes quotes by number (saxutils does &, < and > itself)
_JSTL_QUOTES = {"'": "&#039;", '"': "&#034;"}


def escape(value: Any) -> str:
    """As JSTL's c:out escapes XML (None as the empty string)."""
    return xml_escape("" if value is None else str(value), _JSTL_QUOTES)


def _stats(row: list[float]) -> str:
    return (f'<stats size="{int(row[SIZE])}" consumerCount="{int(row[CONSUMERS])}" '
            f'enqueueCount="{int(row[ENQUEUED])}" dequeueCount="{int(row[DEQUEUED])}"/>')


def destinations_xml(kind: str, rows: dict[str, list[float]], patterns: list[Destination] | None) -> str:
    """queues.jsp or topics.jsp: each (not temporary) destination of `kind` the user may read, in name
    order, with its QueueSize (a topic's is 0, as ActiveMQ's), consumers, enqueued and dequeued."""
    out = [f"<{kind}s>"]
    listed = []
    for uri, row in rows.items():
        destination = parse_destination(uri)
        if (destination.kind == kind and not destination.is_temporary
                and permissions.visible(patterns, destination)):
            listed.append((destination.name, row))
    for name, row in sorted(listed):
        # (topics.jsp writes a space after the name, inside the attribute)
        out.append(f'<{kind} name="{escape(name)}{" " if kind == "topic" else ""}">\n  {_stats(row)}\n'
                   f'</{kind}>')
    out.append(f"</{kind}s>\n")
    return "\n".join(out)


def subscriber_xml(sub: Any, topic: str) -> str:
    """One durable subscription as subscribers.jsp writes it (connectionId empty: a subscription is not
    tied to a connection here; the console's Connections page shows who holds it)."""
    return (f'<subscriber clientId="{escape(sub.client_id)}" '
            f'subscriptionName="{escape(sub.subscription_name)}" connectionId="" '
            f'destinationName="{escape(topic)}" selector="{escape(sub.selector)}" '
            f'active="{"yes" if sub.active else "no"}">\n'
            f'  <stats pendingQueueSize="{sub.pending}" dispatchedQueueSize="{sub.in_flight}" '
            f'dispatchedCounter="{sub.dispatched}" enqueueCounter="{sub.enqueued}" '
            f'dequeueCounter="{sub.dequeued}"/>\n</subscriber>')


class SubscribersTooMany(exceptions.APIException):
    status_code = 503
    default_code = "too_many_subscriptions"


async def durable_topics(patterns: list[Destination] | None) -> set[Destination]:
    """The topics the user may read that have durable subscriptions (the registry, a page at a time). A
    wildcard subscription's pattern is left out: its copies are on the topics it matches."""
    broker = runtime.async_broker()
    found: set[Destination] = set()
    cursor = 0
    while True:
        cursor, topics = await broker.durable_topics_page(cursor, DURABLES_PAGE)
        found.update(t for t in topics if not t.is_wildcard and permissions.visible(patterns, t))
        if not cursor:
            return found


async def subscribers_xml(patterns: list[Destination] | None, most: int) -> str:
    """subscribers.jsp: the durable subscriptions of the topics the user may read, the active ones first (as
    ActiveMQ's two lists), each by topic, client id and subscription name."""
    broker = runtime.async_broker()
    active, inactive = [], []
    read = 0
    for topic in sorted(await durable_topics(patterns), key=lambda t: t.name):
        subs = await broker.subscriptions(topic)
        read += len(subs)
        if read > most:
            raise SubscribersTooMany(f"more than {most} subscriptions to read for one answer "
                                     "(SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS)")
        for sub in sorted((s for s in subs if s.durable),
                          key=lambda s: (s.client_id or "", s.subscription_name or "")):
            (active if sub.active else inactive).append(subscriber_xml(sub, topic.name))
    return "\n".join(["<subscribers>", *active, *inactive, "</subscribers>\n"])


FEEDS = ("queues", "topics", "subscribers")
XML_ANSWER = {(200, "text/xml"): OpenApiResponse(response={"type": "string"}, description="the XML feed")}


class WebConsoleXmlView(GatewayView):
    """GET /admin/xml/<feed>.jsp, logged in as ActiveMQ's console is (HTTP Basic) or with an API token."""

    authentication_classes = [BasicAuthentication, TokenAuthentication]
    http_method_names = ["get", "options"]

    @extend_schema(operation_id="webconsole_xml", tags=["activemq"],
                   summary="ActiveMQ's web console XML feeds: queues.jsp, topics.jsp, subscribers.jsp",
                   parameters=[OpenApiParameter("feed", location=OpenApiParameter.PATH, enum=FEEDS)],
                   responses={**XML_ANSWER, **problems(401, 404, 503)})
    async def get(self, request: Request, feed: str) -> HttpResponse:
        if feed not in FEEDS:  # (the admin site's pages would answer it otherwise: its login page)
            raise Http404(f"no feed {feed[:100]!r}: ActiveMQ's console serves {', '.join(FEEDS)}")
        patterns = await db(permissions.readable_patterns, request.user, "read")
        if feed == "subscribers":
            body = await subscribers_xml(patterns, int(setting("SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS")))
        else:
            current = await index(runtime.async_broker())
            body = destinations_xml(feed.rstrip("s"), current.rows if current else {}, patterns)
        return HttpResponse(body.encode(), content_type=CONTENT_TYPE)
