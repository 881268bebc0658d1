"""The console's login form: Django's, with the login guard's refusal shown as its error."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from gateway.logins import LoginRefused


class LoginForm(AuthenticationForm):
    refusal = ""  # the guard's message when it refused the login unchecked (gateway/logins.py)

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except LoginRefused as exc:
            self.refusal = exc.message
            raise forms.ValidationError(exc.message, code="login_refused") from None
