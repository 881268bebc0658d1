"""A password hasher that counts its checks, for tests proving a login did (or did not) run the hasher.
Django's MD5 hasher underneath (fast; test users are made with it), so existing hashes verify unchanged."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.hashers import MD5PasswordHasher

CHECKS: list[str] = []  # one entry per verify(), in order


class CountingHasher(MD5PasswordHasher):
    def verify(self, password: str, encoded: str) -> bool:
        CHECKS.append(encoded)
        return super().verify(password, encoded)


def counted(settings: Any) -> list[str]:
    """Django verifies passwords with CountingHasher from here on (`settings`: pytest-django's fixture); the
    list of its checks, emptied."""
    settings.PASSWORD_HASHERS = ["tests.helpers.hashers.CountingHasher"]
    CHECKS.clear()
    return CHECKS
