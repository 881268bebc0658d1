"""Settings of the gateway processes the WebSocket tests start: the project's, with fast password hashing
and the WebSocket knobs from the environment (the tests shorten the lease for the fault test). Every test
logs in from 127.0.0.1, so failed logins are not limited per address unless a test says how many, and
are answered at once unless a test sets the pause."""

import os

from signalbox.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SIGNALBOX_WS_LEASE_MS = int(os.environ.get("SIGNALBOX_WS_LEASE_MS", "30000"))
SIGNALBOX_WS_SEND_BUFFER_BYTES = int(os.environ.get("SIGNALBOX_WS_SEND_BUFFER_BYTES", str(1024 * 1024)))
SIGNALBOX_WS_SLOW_CLIENT_SECONDS = float(os.environ.get("SIGNALBOX_WS_SLOW_CLIENT_SECONDS", "30"))
SIGNALBOX_STOMP_CONNECT_TIMEOUT = float(os.environ.get("SIGNALBOX_STOMP_CONNECT_TIMEOUT", "30"))
SIGNALBOX_LOGIN_FAILURES = int(os.environ.get("SIGNALBOX_LOGIN_FAILURES", "0"))
SIGNALBOX_LOGIN_FAILURE_DELAY = float(os.environ.get("SIGNALBOX_LOGIN_FAILURE_DELAY", "0"))
