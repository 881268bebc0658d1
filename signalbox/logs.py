"""The one logging configuration of every process `run` starts (launcher, web server, STOMP listener,
Celery worker and beat), and of manage.py commands.

SIGNALBOX_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO) and SIGNALBOX_LOG_FORMAT (text or json;
default text) choose it; `run --log-level/--log-format` set both for every child. SIGNALBOX_PROCESS names
the process in each line (the launcher sets it per child: "web server", "celery worker", ...).

At INFO a run says what an operator needs: start-up facts, each child's start and exit, errors, and
maintenance ticks that did work or were slow. What repeats on every request or every second (uvicorn's
access log and its lines per WebSocket connection, beat's "Sending due task", the worker's per-task
received/succeeded lines, mingle) shows only at DEBUG. Everything goes to stdout, one line per record; in
json, one JSON object per line (time, level, process, logger, message, then the record's structured
extras), formatted by python-json-logger.

This module imports nothing of Django's, so uvicorn and the launcher can use it before Django loads.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
DEFAULT_PROCESS = "signalbox"

# Loggers whose INFO lines repeat per request, per task or per second: shown at DEBUG only.
CHATTY = (
    "uvicorn.access",  # one line per HTTP request
    "celery.beat",  # "Scheduler: Sending due task" every second
    "celery.app.trace",  # "Task ... succeeded in ..." (failures are ERROR and still show)
    "celery.worker.strategy",  # "Task ... received"
    "celery.worker.consumer.mingle",  # start-up chatter of the worker's neighbour search
    # the websockets library's "connection open" and "connection closed" for each client of the STOMP
    # listener's WebSocket port (gateway/stomp/ws_port.py names this logger)
    "gateway.stomp.ws_port.connections",
)
# uvicorn.error's INFO lines per WebSocket connection (uvicorn's accept, the websockets library's "connection
# open" and "connection closed", written through uvicorn's logger): shown at DEBUG only, as the access log;
# its other lines (the server's start, errors) stay.
PER_CONNECTION = ('%s - "WebSocket %s" [accepted]', "connection open", "connection closed")


class PerConnection(logging.Filter):
    """Drops uvicorn.error's per-connection INFO lines (PER_CONNECTION) unless the log level is DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        return (record.levelno != logging.INFO or record.msg not in PER_CONNECTION
                or logging.getLogger().isEnabledFor(logging.DEBUG))


# Loggers that write a WARNING for each refused request, a client's mistake (Django's "Not Found: /x",
# "Unauthorized: ...", a CSRF refusal): shown at DEBUG only; their ERRORs (a 5xx) always.
PER_REQUEST = ("django.request", "django.security.csrf")

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(process_name)s] %(name)s: %(message)s"
# How a line in TEXT_FORMAT starts: the launcher wraps a child's line that does not (printed outside
# logging) as a record of that child.
TEXT_LINE_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \[")
# uvicorn adds `color_message` (the message with ANSI colours) to some records; not an extra worth sending.
_NOT_EXTRAS = ("color_message",)


class LogSettingError(ValueError):
    """SIGNALBOX_LOG_LEVEL or SIGNALBOX_LOG_FORMAT holds a value this module does not know."""


def level_from(value: str | None, source: str = "SIGNALBOX_LOG_LEVEL") -> str:
    level = (value or "INFO").strip().upper()
    if level not in LEVELS:
        raise LogSettingError(f"{source}={value!r} is not a log level; use one of {', '.join(LEVELS)}")
    return level


def format_from(value: str | None, source: str = "SIGNALBOX_LOG_FORMAT") -> str:
    fmt = (value or "text").strip().lower()
    if fmt not in FORMATS:
        raise LogSettingError(f"{source}={value!r} is not a log format; use text or json")
    return fmt


class ProcessName(logging.Filter):
    """Adds `process_name`: which of the run's processes wrote the line (SIGNALBOX_PROCESS)."""

    def __init__(self) -> None:
        super().__init__()
        self.process_name = os.environ.get("SIGNALBOX_PROCESS") or DEFAULT_PROCESS

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "process_name"):  # the launcher names the child whose stray line it relays
            record.process_name = self.process_name
        return True


class OneLine(logging.Formatter):
    """TEXT_FORMAT, one line per record: a message's or a traceback's line breaks are written as \\n (as
    the json format does inside its strings), so a line of the run is always one event of one process."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\r", "\\r").replace("\n", "\\n")


def json_formatter() -> logging.Formatter:
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    formatter = JsonFormatter(
        ["asctime", "levelname", "process_name", "name", "message"],
        rename_fields={"asctime": "time", "levelname": "level", "process_name": "process", "name": "logger"},
        reserved_attrs=[*RESERVED_ATTRS, *_NOT_EXTRAS],
    )
    # time: ISO 8601 in UTC with milliseconds, e.g. 2026-11-28T01:09:50.091Z
    formatter.converter = time.gmtime
    formatter.default_time_format = "%Y-%m-%dT%H:%M:%S"
    formatter.default_msec_format = "%s.%03dZ"
    return formatter


def config(level: str | None = None, fmt: str | None = None) -> dict[str, Any]:
    """The dictConfig for this process: from the arguments, else SIGNALBOX_LOG_LEVEL/_FORMAT."""
    level = level_from(level if level is not None else os.environ.get("SIGNALBOX_LOG_LEVEL"))
    fmt = format_from(fmt if fmt is not None else os.environ.get("SIGNALBOX_LOG_FORMAT"))
    formatter = ({"()": "signalbox.logs.json_formatter"} if fmt == "json"
                 else {"()": "signalbox.logs.OneLine", "fmt": TEXT_FORMAT})
    chatty = "DEBUG" if level == "DEBUG" else max(level, "WARNING", key=LEVELS.index)
    # Loggers that came with handlers of their own (uvicorn's, Django's console) hand their records to
    # the root's one handler instead, so each record is written once and in the one format.
    loggers: dict[str, dict[str, Any]] = {
        name: {"handlers": [], "propagate": True}
        for name in ("uvicorn", "uvicorn.error", "django", "django.server", "py.warnings")
    }
    loggers.update({name: {"handlers": [], "propagate": True, "level": chatty} for name in CHATTY})
    refused = "DEBUG" if level == "DEBUG" else max(level, "ERROR", key=LEVELS.index)
    loggers.update({name: {"handlers": [], "propagate": True, "level": refused} for name in PER_REQUEST})
    loggers["py4j"] = {"level": "WARNING"}  # narrates every gateway connection of Spark at INFO
    loggers["uvicorn.error"]["filters"] = ["per_connection"]
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"process_name": {"()": "signalbox.logs.ProcessName"},
                    "per_connection": {"()": "signalbox.logs.PerConnection"}},
        "formatters": {"signalbox": formatter},
        "handlers": {
            "stdout": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stdout",
                "formatter": "signalbox",
                "filters": ["process_name"],
            },
        },
        "root": {"handlers": ["stdout"], "level": level},
        "loggers": loggers,
    }


def configure(level: str | None = None, fmt: str | None = None) -> None:
    """Apply `config` now, and route warnings (e.g. DeprecationWarning) through it as well."""
    import logging.config

    logging.config.dictConfig(config(level, fmt))
    logging.captureWarnings(True)
