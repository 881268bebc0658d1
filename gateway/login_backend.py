"""Django's ModelBackend behind the login guard (gateway/logins.py): settings.AUTHENTICATION_BACKENDS.
(A module of its own: Django's backends import the auth models, which the sockets' modules, imported
before Django is set up, must not.)"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend

from gateway.logins import client_address, guard


class GuardedModelBackend(ModelBackend):
    """Django's ModelBackend behind the guard. The sockets pass the client's `address` (they have no
    request); the HTTP paths' is their request's."""

    def authenticate(self, request: Any, username: str | None = None, password: str | None = None,
                     address: str | None = None, **kwargs: Any) -> Any:
        if username is None or password is None:
            return None
        name, secret = (text.encode("utf-8", "surrogatepass") for text in (username, password))
        presented = b"%d\x00%s\x00%s" % (len(name), name, secret)
        return guard.check(address or client_address(request), presented,
                           lambda: ModelBackend.authenticate(self, request, username, password, **kwargs))
