"""What broker_core's own Redis connections share (drivers/multiplexed.py for AsyncBroker,
drivers/direct.py for Broker):
packing a command, the exceptions for error replies, a MULTI/EXEC block's outcome, and the connection
settings they copy from a redis-py client.

Both connections stand in for redis-py only on the hot path (script calls and their transactions), and
only for a client they can mirror exactly: a plain TCP or unix-socket connection speaking RESP2 with
bytes replies and a fixed password, if any. `connect_settings` returns None for anything else (TLS,
RESP3, decoded responses, a credential provider), and the broker then keeps redis-py.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis
from redis.exceptions import NoScriptError


def reply_text(value: Any) -> str:
    """A reply value (bytes, or already str or a number) as text; bytes that are not UTF-8 are shown
    with replacement characters rather than raising, as these are names and fields to show or parse."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def reply_error(text: str) -> Exception:
    """The exception redis-py would raise for an error reply (the ones broker_core tells apart)."""
    if text.startswith("NOSCRIPT"):
        return NoScriptError(text.partition(" ")[2] or text)
    if text.startswith("LOADING"):  # a restarted Redis replaying its AOF: unavailable for a moment
        return redis.BusyLoadingError(text.partition(" ")[2] or text)
    return redis.ResponseError(text)


def pack(args: tuple | list) -> bytes:
    """One command in RESP: an array of bulk strings (bytes, str, int or float arguments)."""
    try:
        return hiredis.pack_command(tuple(args))
    except TypeError as exc:  # as redis-py refuses None, bools and other objects
        bad = next((a for a in args if isinstance(a, bool) or not isinstance(a, bytes | str | int | float)),
                   "?")
        raise redis.DataError(f"invalid argument {bad!r}: a command takes bytes, str, int or float") from exc


def setup_commands(settings: dict[str, Any]) -> list[tuple]:
    """What a new connection sends before any call: AUTH, CLIENT SETNAME, SELECT, as the client would."""
    commands: list[tuple] = []
    if settings["password"] is not None:
        commands.append(("AUTH", settings["username"], settings["password"]) if settings["username"]
                        else ("AUTH", settings["password"]))
    if settings["client_name"]:
        commands.append(("CLIENT", "SETNAME", settings["client_name"]))
    if settings["db"]:
        commands.append(("SELECT", settings["db"]))
    return commands


def transaction_result(reply: Any, queued_errors: list[Exception]) -> list[Any]:
    """EXEC's reply as redis-py's pipeline(transaction=True).execute(raise_on_error=False) gives it:
    each command's reply or its error."""
    if isinstance(reply, Exception):  # EXECABORT: a command was refused while queueing, none ran
        raise queued_errors[0] if queued_errors else reply
    if reply is None:
        raise redis.WatchError("the transaction was aborted")
    return list(reply)


def connect_settings(pool: Any, plain: set[type]) -> dict[str, Any] | None:
    """How to open a connection like the pool's (host and port or unix path, db, credentials, name,
    timeouts), or None when the pool's connections are not `plain` ones this module can mirror."""
    kwargs = pool.connection_kwargs
    if pool.connection_class not in plain or kwargs.get("decode_responses") \
            or kwargs.get("credential_provider") is not None \
            or kwargs.get("protocol") not in (None, 2, "2"):
        return None
    settings = {key: kwargs.get(key) for key in ("host", "port", "path", "db", "username", "password",
                                                  "client_name", "socket_connect_timeout", "socket_timeout",
                                                  "socket_keepalive")}
    if settings["path"] is None:
        settings["host"] = settings["host"] or "localhost"
        settings["port"] = int(settings["port"] or 6379)
    return settings
