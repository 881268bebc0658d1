"""Django settings for Signalbox. Every deployment knob is an environment variable (README lists them).

REDIS_URL and DATABASE_URL switch between the embedded services and external ones with no code
change; everything that talks to Redis (broker_core, Channels, Celery) derives from REDIS_URL.
"""

from __future__ import annotations

import os
import secrets
import urllib.parse
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from signalbox import logs

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


# Local state of the embedded set-up: Redis config/AOF, SQLite database, secret key, beat schedule.
DATA_DIR = Path(os.environ.get("SIGNALBOX_DATA_DIR") or BASE_DIR / "var").resolve()

# Port of the embedded Redis the launcher starts when REDIS_URL is unset.
EMBEDDED_REDIS_PORT = int(os.environ.get("SIGNALBOX_REDIS_PORT") or 6390)
REDIS_URL = os.environ.get("REDIS_URL") or f"redis://127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
# broker_core's key prefix in Redis, and the destination policy file loaded when the system starts
# (ActiveMQ's <destinationPolicy>; format in signalbox.example.toml). Without one, ActiveMQ's defaults.
SIGNALBOX_NAMESPACE = os.environ.get("SIGNALBOX_NAMESPACE") or "sb"
SIGNALBOX_POLICY_FILE = os.environ.get("SIGNALBOX_POLICY_FILE") or (
    str(BASE_DIR / "signalbox.toml") if (BASE_DIR / "signalbox.toml").exists() else "")


def _secret_key() -> str:
    """SIGNALBOX_SECRET_KEY, else a key generated once and kept in the data folder."""
    if os.environ.get("SIGNALBOX_SECRET_KEY"):
        return os.environ["SIGNALBOX_SECRET_KEY"]
    path = DATA_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        # O_EXCL: when several processes start at once, the first writer wins and the rest read it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key


SECRET_KEY = _secret_key()
DEBUG = env_bool("SIGNALBOX_DEBUG", False)
ALLOWED_HOSTS = env_list("SIGNALBOX_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("SIGNALBOX_CSRF_TRUSTED_ORIGINS", [])
# Browser pages that may open the WebSockets (the session cookie rides along): scheme://host[:port],
# compared whole. Unset: ALLOWED_HOSTS at the scheme and port the connection came in on (signalbox/routing).
SIGNALBOX_ALLOWED_ORIGINS = env_list("SIGNALBOX_ALLOWED_ORIGINS", [])
# The web server's port (the launcher's SIGNALBOX_PORT), for a connection that does not say it.
SIGNALBOX_PORT = int(os.environ.get("SIGNALBOX_PORT") or 8000)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",  # API tokens: REST clients and STOMP/WebSocket logins
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from our own static files (no CDN)
    "gateway",
    "console",
    "analytics.apps.AnalyticsConfig",  # the signalbox_analytics management command
]

# Django's usual stack. The gateway's API requests run these inline on the event loop instead of
# two thread hops per middleware (gateway/api/middleware.py); everything else is unchanged.
MIDDLEWARE = [
    "gateway.api.middleware.SecurityMiddleware",
    "gateway.api.middleware.SessionMiddleware",
    "gateway.api.middleware.CommonMiddleware",
    "gateway.api.middleware.CsrfViewMiddleware",
    "gateway.api.middleware.AuthenticationMiddleware",
    "gateway.api.middleware.MessageMiddleware",
    "gateway.api.middleware.XFrameOptionsMiddleware",
    "gateway.api.errors.UnavailableMiddleware",  # Redis unreachable: 503 + Retry-After, not 500
    "gateway.metrics.route_middleware",  # innermost: names the matched route for /metrics
]

ROOT_URLCONF = "signalbox.urls"
ASGI_APPLICATION = "signalbox.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database() -> dict:
    url = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'db.sqlite3'}"
    try:
        # Persistent connections do not mix with async views (each runs in a fresh thread).
        config = dj_database_url.parse(url, conn_max_age=0, conn_health_checks=True)
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL Django understands: {exc}") from exc
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # uvicorn, the worker and beat share one file: WAL lets readers run beside the writer.
        config["OPTIONS"] = {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS: list = [BASE_DIR / "static"]
# uPlot, the console's charts, from npm (package.json; signalbox.sh installs it when npm is there): served
# as /static/vendor/uplot/. Without it the console's charts say so and show the figures as text.
UPLOT_DIR = BASE_DIR / "node_modules" / "uplot" / "dist"
if UPLOT_DIR.is_dir():
    STATICFILES_DIRS.append(("vendor/uplot", UPLOT_DIR))
STATIC_ROOT = DATA_DIR / "static"

# Channels: the Redis channel layer wakes the gateway process that owns a consumer.
# The layer waits for messages with BZPOPMIN, 5 s at a time. redis-py 8 made socket_timeout default
# to 5 s as well, so an idle consumer's read raced the server's reply and died with TimeoutError
# (django/channels_redis#422); the read timeout must stay well above the blocking timeout.
CHANNEL_LAYER_SOCKET_TIMEOUT = 15
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT}],
            "prefix": "signalbox:asgi",
        },
    },
}

# The REST gateway (gateway/api). Clients log in with a token (`Authorization: Token <key>`), the
# console with its session; HTTP Basic only on ActiveMQ's /api/message. Every error is RFC 9457
# problem details. No pagination default: list endpoints page themselves (limit/offset, cursors).
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "gateway.api.auth.TokenAuthentication",
        "gateway.api.auth.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "gateway.api.common.JSONParser",  # DRF's, with the nesting and lone-surrogate limits
        "rest_framework.parsers.FormParser",
    ],
    "EXCEPTION_HANDLER": "gateway.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Signalbox API",
    "DESCRIPTION": (
        "HTTP gateway of the Signalbox message broker: produce, consume with leases, administer. "
        "Errors are RFC 9457 problem details (application/problem+json). Authenticate with "
        "`Authorization: Token <key>` (POST /api/v1/auth/token) or a console session. "
        "/api/message/ is ActiveMQ's REST MessageServlet, for existing ActiveMQ clients."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and its page are for authenticated users, as the API (signalbox/urls.py says why).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Every operation documents every problem it can answer (gateway/api/schema.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "gateway.api.schema.complete_problems"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {},
    # A path's names and ids: any text, sent percent-encoded whole (gateway/paths.py), `/` included; not
    # the converter's `[^/]+`, which is the encoded segment's shape.
    "PATH_CONVERTER_OVERRIDES": {"segment": {"type": "string", "minLength": 1}},
}
# Gateway knobs. Long-poll receives wait at most this long (seconds), like ActiveMQ's 20 s readTimeout cap.
SIGNALBOX_MAX_RECEIVE_WAIT = float(os.environ.get("SIGNALBOX_MAX_RECEIVE_WAIT") or 20.0)
# Requests per second per user on the API (0 = unlimited); beyond it, 429 with Retry-After.
SIGNALBOX_API_RATE_LIMIT = int(os.environ.get("SIGNALBOX_API_RATE_LIMIT") or 0)
# How long a process trusts a verified token or Basic login, and its snapshot of the permission rules.
SIGNALBOX_AUTH_CACHE_SECONDS = float(os.environ.get("SIGNALBOX_AUTH_CACHE_SECONDS") or 30.0)
SIGNALBOX_AUTH_CACHE_ENTRIES = int(os.environ.get("SIGNALBOX_AUTH_CACHE_ENTRIES") or 10_000)
# What a wrong password may cost (gateway/logins.py): failed password logins per client address within
# the window before that address is refused for a while; password checks at once per process, and how
# many more may wait; how long a failed or refused login waits for its answer.
SIGNALBOX_LOGIN_FAILURES = int(os.environ.get("SIGNALBOX_LOGIN_FAILURES") or 10)
SIGNALBOX_LOGIN_FAILURE_SECONDS = float(os.environ.get("SIGNALBOX_LOGIN_FAILURE_SECONDS") or 60.0)
SIGNALBOX_LOGIN_CONCURRENCY = int(os.environ.get("SIGNALBOX_LOGIN_CONCURRENCY") or 1)
SIGNALBOX_LOGIN_QUEUE = int(os.environ.get("SIGNALBOX_LOGIN_QUEUE") or 16)
SIGNALBOX_LOGIN_FAILURE_DELAY = float(os.environ.get("SIGNALBOX_LOGIN_FAILURE_DELAY") or 1.0)
AUTHENTICATION_BACKENDS = ["gateway.login_backend.GuardedModelBackend"]
# How soon a process forgets remembered credentials after another process changed a user or token.
SIGNALBOX_AUTH_CHANGES_SECONDS = float(os.environ.get("SIGNALBOX_AUTH_CHANGES_SECONDS") or 1.0)
SIGNALBOX_PERMISSION_CACHE_SECONDS = float(os.environ.get("SIGNALBOX_PERMISSION_CACHE_SECONDS") or 1.0)
# Lease of the consumers behind ActiveMQ's /api/message GET (renewed by every GET of that client).
SIGNALBOX_COMPAT_LEASE_MS = int(os.environ.get("SIGNALBOX_COMPAT_LEASE_MS") or 300_000)
# MBeans one /api/jolokia HTTP request's answers may name, a POST's requests together
# (gateway/api/jolokia.py); past it a request is refused.
SIGNALBOX_JOLOKIA_MAX_OBJECTS = int(os.environ.get("SIGNALBOX_JOLOKIA_MAX_OBJECTS") or 20_000)
# Subscriptions one /admin/xml/subscribers.jsp reads at most (gateway/api/webconsole_xml.py): past it the
# answer is refused naming this, rather than cut short.
SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS = int(os.environ.get("SIGNALBOX_WEBCONSOLE_XML_MAX_SUBSCRIPTIONS")
                                                 or 10_000)
# Idempotency-Key records a user may hold at once (each kept 24 h); a new key past it is refused (429).
SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER = int(os.environ.get("SIGNALBOX_IDEMPOTENCY_KEYS_PER_USER") or 100_000)
# The console's "slow" consumer (gateway/api/views_admin.consumer_json): window full, no ack for this long.
SIGNALBOX_CONSOLE_SLOW_SECONDS = float(os.environ.get("SIGNALBOX_CONSOLE_SLOW_SECONDS") or 30.0)
# Every process (web, worker, beat, STOMP listener) writes a heartbeat to Redis this often
# (signalbox/node.py); the node page calls one missing after three missed beats.
SIGNALBOX_HEARTBEAT_SECONDS = float(os.environ.get("SIGNALBOX_HEARTBEAT_SECONDS") or 5.0)
# /healthz reports the maintenance tick stale (beat or every worker stopped) after this many seconds.
SIGNALBOX_MAINTENANCE_STALE_SECONDS = float(os.environ.get("SIGNALBOX_MAINTENANCE_STALE_SECONDS") or 15.0)
# A maintenance tick that takes longer than this (seconds) is logged as a WARNING; a tick that did work
# (reaped, dispatched, expired, ...) at INFO; an idle one at DEBUG only.
SIGNALBOX_MAINTENANCE_SLOW_SECONDS = float(os.environ.get("SIGNALBOX_MAINTENANCE_SLOW_SECONDS") or 1.0)
# GET /metrics (docs/metrics.md) answers only `Authorization: Bearer <this>`; unset, it answers 403. Stripped:
# a value filled from a file (a Kubernetes secret) keeps its line end, which no scraper sends.
SIGNALBOX_METRICS_TOKEN = (os.environ.get("SIGNALBOX_METRICS_TOKEN") or "").strip()
METRICS_TOKEN_MIN_LENGTH = 16


def metrics_off(token: str) -> str | None:
    """Why GET /metrics answers 403 with this SIGNALBOX_METRICS_TOKEN (None: it is on). The endpoint's
    answer and the launcher's start-up line (`run`) say the same."""
    if not token:
        return (f"metrics are off: set SIGNALBOX_METRICS_TOKEN to a secret of at least "
                f"{METRICS_TOKEN_MIN_LENGTH} characters and scrape with 'Authorization: Bearer <it>'")
    if len(token) < METRICS_TOKEN_MIN_LENGTH:
        return (f"metrics are off: SIGNALBOX_METRICS_TOKEN has {len(token)} characters, it needs at least "
                f"{METRICS_TOKEN_MIN_LENGTH}")
    return None


# A scrape shows at most this many destinations (the oldest); the rest are counted as omitted.
SIGNALBOX_METRICS_MAX_DESTINATIONS = int(os.environ.get("SIGNALBOX_METRICS_MAX_DESTINATIONS") or 20_000)
# The STOMP listener (`manage.py stomp_listener`, which `run` starts): STOMP over TCP (gateway/stomp/tcp.py)
# and over WebSocket on a port of its own (gateway/stomp/ws_port.py, ActiveMQ's ws:// connector). The
# address, the plain ports (0: none), the TLS ones (stomp+ssl, wss: used when a PEM certificate and key are
# given; 0: none) and how many connections one listener process serves at once, on each port. The defaults
# are ActiveMQ's: stomp 61613 and ws 61614 as its activemq.xml ships them, stomp+ssl 61612 as its own STOMP
# SSL tests use it; wss has no port of ActiveMQ's own (61619 here).
SIGNALBOX_STOMP_HOST = os.environ.get("SIGNALBOX_HOST") or "127.0.0.1"
SIGNALBOX_STOMP_PORT = int(os.environ.get("SIGNALBOX_STOMP_PORT") or 61613)
SIGNALBOX_STOMP_TLS_PORT = int(os.environ.get("SIGNALBOX_STOMP_TLS_PORT") or 61612)
SIGNALBOX_STOMP_WS_PORT = int(os.environ.get("SIGNALBOX_STOMP_WS_PORT") or 61614)
SIGNALBOX_STOMP_WSS_PORT = int(os.environ.get("SIGNALBOX_STOMP_WSS_PORT") or 61619)
SIGNALBOX_STOMP_TLS_CERT = os.environ.get("SIGNALBOX_STOMP_TLS_CERT") or ""
SIGNALBOX_STOMP_TLS_KEY = os.environ.get("SIGNALBOX_STOMP_TLS_KEY") or ""
SIGNALBOX_STOMP_MAX_CONNECTIONS = int(os.environ.get("SIGNALBOX_STOMP_MAX_CONNECTIONS") or 1000)
# The WebSocket and STOMP sessions' knobs, whose defaults live where they are used (gateway/ws/link.py
# LinkSettings, gateway/stomp/protocol.py StompSettings; docs/websocket.md "Settings"), and a transaction's
# limits (broker_core/model.py TransactionLimits; docs/broker_core.md "Transactions") and a queue's consumers
# (SIGNALBOX_MAX_CONSUMERS, model.py MAX_CONSUMERS; 0: no limit): a setting here only
# when the environment gives one, checked as a number now rather than at the first connection.
for _knob in ("SIGNALBOX_WS_LEASE_MS", "SIGNALBOX_WS_SEND_BUFFER_BYTES", "SIGNALBOX_WS_SLOW_CLIENT_SECONDS",
              "SIGNALBOX_WS_MAX_SUBSCRIPTIONS", "SIGNALBOX_WS_RECEIVE_BATCH", "SIGNALBOX_WS_BROWSE_PAGE",
              "SIGNALBOX_WS_MAX_TRANSACTIONS",
              "SIGNALBOX_MAX_TRANSACTION_SIZE", "SIGNALBOX_MAX_TRANSACTION_BYTES",
              "SIGNALBOX_MAX_TRANSACTION_DESTINATIONS", "SIGNALBOX_MAX_CONSUMERS",
              "SIGNALBOX_STOMP_MAX_BODY", "SIGNALBOX_STOMP_MAX_HEADERS",
              "SIGNALBOX_STOMP_MAX_HEADER_LINE", "SIGNALBOX_STOMP_HEARTBEAT_MIN_MS",
              "SIGNALBOX_STOMP_HEARTBEAT_GRACE", "SIGNALBOX_STOMP_CONNECT_TIMEOUT"):
    if os.environ.get(_knob):
        try:
            globals()[_knob] = float(os.environ[_knob])
        except ValueError:
            raise ImproperlyConfigured(f"{_knob}={os.environ[_knob]!r} is not a number") from None
# A transaction's limits are every adapter's (broker_core TransactionLimits, where their defaults live;
# gateway/runtime.py gives them to its brokers), no longer the WebSocket sessions': their old names are
# refused, naming the new, rather than ignored.
for _knob in ("SIGNALBOX_MAX_TRANSACTION_SIZE", "SIGNALBOX_MAX_TRANSACTION_BYTES",
              "SIGNALBOX_MAX_TRANSACTION_DESTINATIONS"):
    _old = _knob.replace("SIGNALBOX_", "SIGNALBOX_WS_")
    if os.environ.get(_old):
        raise ImproperlyConfigured(f"{_old} is now {_knob}: it limits transactions of every adapter")
# The connection registry (gateway/connections.py, docs/console.md "Connections"): each process renews its
# connections' entries every third of the lease, so a dead process's connections leave the list within it;
# at most LIMIT connections are registered (a new one past it is refused, naming the setting); close
# requests are taken every POLL seconds.
SIGNALBOX_CONNECTION_LEASE_MS = int(os.environ.get("SIGNALBOX_CONNECTION_LEASE_MS") or 15_000)
SIGNALBOX_CONNECTION_REGISTRY_LIMIT = int(os.environ.get("SIGNALBOX_CONNECTION_REGISTRY_LIMIT") or 100_000)
SIGNALBOX_CONNECTION_POLL_SECONDS = float(os.environ.get("SIGNALBOX_CONNECTION_POLL_SECONDS") or 1.0)
# Temporary destinations one STOMP connection may create (/temp-queue/<name>, /temp-topic/<name>; past it a
# frame naming a new one is refused with an ERROR naming the setting). ActiveMQ has no such bound.
SIGNALBOX_TEMP_DESTINATION_LIMIT = int(os.environ.get("SIGNALBOX_TEMP_DESTINATION_LIMIT") or 100)
# While Redis cannot be reached the API answers 503 with this Retry-After (seconds; gateway/unavailable.py).
SIGNALBOX_UNAVAILABLE_RETRY_AFTER = int(os.environ.get("SIGNALBOX_UNAVAILABLE_RETRY_AFTER") or 1)
# Largest request body (a batch of messages); larger requests get 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("SIGNALBOX_MAX_REQUEST_BYTES") or 16 * 1024 * 1024)


def celery_redis_url(url: str) -> str:
    """REDIS_URL as Celery takes it: redis-py's unix://PATH?db=N (the embedded server's socket,
    signalbox/embedded_redis.py) is Celery's redis+socket://PATH?virtual_host=N; other URLs are the same."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "unix":
        return url
    query = urllib.parse.parse_qs(parts.query)
    db = query.pop("db", ["0"])[0]
    rest = urllib.parse.urlencode({**{k: v[0] for k, v in query.items()}, "virtual_host": db})
    return f"redis+socket://{parts.netloc}{parts.path}?{rest}"  # (netloc: empty, or 'user:password@')


# Celery (the app reads every CELERY_* name). Broker and results live in the same Redis by default.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or celery_redis_url(REDIS_URL)
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or celery_redis_url(REDIS_URL)
CELERY_RESULT_EXPIRES = 3600
# Several deployments (or test sessions) can share one Redis by using different queues.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("SIGNALBOX_CELERY_QUEUE") or "signalbox"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery 6's default, said here so a lost connection (Redis restarting) is not also a deprecation notice:
# no task acknowledges late, so there is nothing for it to cancel.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BEAT_SCHEDULE: dict[str, dict] = {}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# /healthz waits at most this long for each dependency (Redis, database, a Celery worker's pong).
HEALTH_CHECK_TIMEOUT = float(os.environ.get("SIGNALBOX_HEALTH_TIMEOUT") or 1.0)

# One logging configuration for every process `run` starts (signalbox/logs.py): SIGNALBOX_LOG_LEVEL,
# SIGNALBOX_LOG_FORMAT (text or json), one line per record on stdout.
try:
    LOGGING = logs.config()
except logs.LogSettingError as exc:
    raise ImproperlyConfigured(str(exc)) from None
# Django applies LOGGING itself; Celery's processes apply it through the setup_logging signal.
