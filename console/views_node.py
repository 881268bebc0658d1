"""The console's node page (/console/node/, staff only): a shell the browser fills from
GET /api/v1/console/node every 2 s (static/console/node.js)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse

from console.views import LOGIN, _forbidden, _page
from gateway.permissions import is_staff


@login_required(login_url=LOGIN)
def node(request: HttpRequest) -> HttpResponse:
    # hosts, process ids and Redis internals, as the API: the operators' business
    if not is_staff(request.user):
        return _forbidden(request, "The node's health is for staff users.")
    return _page(request, "node.html", "node")
