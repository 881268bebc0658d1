"""Changing a user from an async test, as an administrator would (the credential cache tests of REST and
of socket logins both do): off asgiref's shared thread, where Channels closes old database connections
and would trip over one a test left open (tests.gateway_api.mixins.blocking says why)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User


@sync_to_async(thread_sensitive=False)
def change_user(name: str, **fields: Any) -> None:
    """Set `fields` on the user `name` (password= sets a new password) and save it."""
    user = User.objects.get(username=name)
    password = fields.pop("password", None)
    if password is not None:
        user.set_password(password)
    for key, value in fields.items():
        setattr(user, key, value)
    user.save()
