"""The console's login page: Django's login form, with the password checked in a login thread.

Django runs every synchronous view of a process in one thread; its LoginView would check the password
there (PBKDF2, about half a second), and while a login waits for its turn at the login guard
(gateway/logins.py) every other console page of the process would wait behind it. This view is a
coroutine: the form's check runs in a thread of the logins' own (`in_login_thread`), a refusal shows the
guard's message, and a failed or refused login is answered after `failure_pause`, as the API's are."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django import forms
from django.contrib.auth import login as start_session
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.debug import sensitive_post_parameters

from gateway.logins import LoginRefused, failure_pause, in_login_thread

HOME = "console:overview"


class LoginForm(AuthenticationForm):
    refusal = ""  # the guard's message when it refused the login unchecked

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except LoginRefused as exc:
            self.refusal = exc.message
            raise forms.ValidationError(exc.message, code="login_refused") from None


def _asked(request: HttpRequest) -> str:
    """The `next` the login page was asked to go on to (the form's, else the query's)."""
    return request.POST.get("next") or request.GET.get("next") or ""


def _next(request: HttpRequest) -> str:
    """Where to go once logged in: the `next` asked for when it is on this site, else the overview."""
    wanted = _asked(request)
    if url_has_allowed_host_and_scheme(wanted, allowed_hosts={request.get_host()},
                                       require_https=request.is_secure()):
        return wanted
    return resolve_url(HOME)


@sensitive_post_parameters()
@csrf_protect
@never_cache
async def login(request: HttpRequest) -> HttpResponse:
    if (await request.auser()).is_authenticated:
        return HttpResponseRedirect(_next(request))
    form = LoginForm(request, data=request.POST if request.method == "POST" else None)
    if request.method == "POST":
        if await in_login_thread(form.is_valid):
            await sync_to_async(start_session)(request, form.get_user())
            return HttpResponseRedirect(_next(request))
        await failure_pause()
    return await sync_to_async(render)(request, "console/login.html", {"form": form, "next": _asked(request)})
