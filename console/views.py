"""The console's pages: server-rendered shells whose tables and charts the browser fills from the REST
API (/api/v1) and keeps live over /ws/console/events. Each page gets the user's permissions on its
destination, so actions they may not take are not shown; the API refuses them anyway."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from broker_core.destinations import Destination, parse_destination
from broker_core.errors import InvalidDestination
from gateway.api.destination_index import is_dead_letter_queue
from gateway.permissions import ACTIONS, allowed, is_staff

LOGIN = "console:login"


def _queue(name: str, kind: str = "queue") -> Destination:
    try:
        return parse_destination(name, kind)  # type: ignore[arg-type]
    except InvalidDestination as exc:
        raise Http404(str(exc)) from None


def _may(request: HttpRequest, destination: Destination) -> dict[str, bool]:
    return {action: allowed(request.user, destination, action) for action in ACTIONS}


def _page(request: HttpRequest, template: str, section: str, **context: Any) -> HttpResponse:
    return render(request, f"console/{template}", {"section": section, **context})


def _forbidden(request: HttpRequest, detail: str) -> HttpResponse:
    """403 as a console page (not an exception: Django would log each refusal with a traceback)."""
    return render(request, "console/forbidden.html", {"detail": detail, "section": ""}, status=403)


def _queue_page(request: HttpRequest, name: str, template: str, section: str, kind: str = "queue",
                **context: Any) -> HttpResponse:
    destination = _queue(name, kind)
    may = _may(request, destination)
    if not may["read"]:
        return _forbidden(request, f"You have no read permission on {destination.uri}.")
    return _page(request, template, section, destination=destination, may=may, **context)


@login_required(login_url=LOGIN)
def overview(request: HttpRequest) -> HttpResponse:
    return _page(request, "overview.html", "overview")


@login_required(login_url=LOGIN)
def destinations(request: HttpRequest) -> HttpResponse:
    return _page(request, "destinations.html", "destinations")


@login_required(login_url=LOGIN)
def queue(request: HttpRequest, name: str) -> HttpResponse:
    return _queue_page(request, name, "queue.html", "destinations")


@login_required(login_url=LOGIN)
def topic(request: HttpRequest, name: str) -> HttpResponse:
    return _queue_page(request, name, "topic.html", "destinations", kind="topic")


@login_required(login_url=LOGIN)
def browse(request: HttpRequest, name: str) -> HttpResponse:
    # (the same test as the destination list's filter: retry is offered on what is a dead-letter queue)
    return _queue_page(request, name, "browse.html", "destinations", selector=request.GET.get("selector", ""),
                       dead_letter_queue=is_dead_letter_queue(name))


@login_required(login_url=LOGIN)
def message(request: HttpRequest, name: str, message_id: str) -> HttpResponse:
    return _queue_page(request, name, "message.html", "destinations", message_id=message_id)


@login_required(login_url=LOGIN)
def dead_letters(request: HttpRequest) -> HttpResponse:
    return _page(request, "dead_letters.html", "dead-letters")


@login_required(login_url=LOGIN)
def send(request: HttpRequest) -> HttpResponse:
    return _page(request, "send.html", "send", destination=request.GET.get("destination", ""))


@login_required(login_url=LOGIN)
def audit(request: HttpRequest) -> HttpResponse:
    if not is_staff(request.user):
        return _forbidden(request, "The audit log is for staff users.")
    return _page(request, "audit.html", "audit")


@login_required(login_url=LOGIN)
def routing(request: HttpRequest) -> HttpResponse:
    # as GET /api/v1/virtual-destinations: routing names destinations across the broker
    if not is_staff(request.user):
        return _forbidden(request, "The virtual destination routing is for staff users.")
    return _page(request, "routing.html", "routing")


@login_required(login_url=LOGIN)
def connections(request: HttpRequest) -> HttpResponse:
    # who sees which connection is the API's decision (gateway/api/views_connections.py)
    return _page(request, "connections.html", "connections", admin=is_staff(request.user))


@login_required(login_url=LOGIN)
def connection(request: HttpRequest, connection_id: str) -> HttpResponse:
    return _page(request, "connection.html", "connections", connection_id=connection_id,
                 admin=is_staff(request.user))
