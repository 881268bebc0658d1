"""One-machine launcher behind `./signalbox.sh run|test` (also `python -m signalbox.launcher`).

`run` starts the embedded Redis (unless REDIS_URL is set), migrates the database, creates the first
admin user, then supervises uvicorn (HTTP + WebSocket), the STOMP listener (TCP, and TLS when configured),
a Celery worker and Celery beat. A child that
exits on its own is restarted after a back-off (Redis on the same port, data folder and AOF), with one
line saying so; only a crash loop ends the run (`RestartPolicy`). Ctrl-C stops the children in order,
Redis last so the worker can finish with it. `test` runs ruff, the import contracts, then pytest.

A configuration mistake ends `run` with one line on stderr naming the problem and the fix.

Logging (signalbox/logs.py): the launcher and every child log in one format at one level
(`--log-level`/SIGNALBOX_LOG_LEVEL, `--log-format`/SIGNALBOX_LOG_FORMAT), each line naming its process
(SIGNALBOX_PROCESS). The children's output comes back through a pipe and the launcher writes it out, so
in json even a line a child prints outside logging (a crash's traceback, Celery's "Warm shutdown") is
one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NoReturn
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
import redis

from broker_core.config.system_usage import load_system_usage
from broker_core.config.virtual import load_virtual_config
from signalbox import logs
from signalbox.embedded_redis import (
    APPENDFSYNC_POLICIES,
    DEFAULT_APPENDFSYNC,
    EmbeddedRedis,
    EmbeddedRedisError,
    configured_executable,
    die_with_parent,
    maxmemory_setting,
    port_in_use,
    port_open,
)

BASE_DIR = Path(__file__).resolve().parent.parent
MIN_REDIS_VERSION = (6, 2)
# uvicorn's WebSocket protocol with the gateway's view of unsent bytes (gateway/ws/uvicorn_ws.py): an
# auto-acknowledged message counts as sent once its bytes left the process. Every web process runs it.
WEB_SOCKET_PROTOCOL = "gateway.ws.uvicorn_ws:WebSocketProtocol"


class ConfigError(Exception):
    """A problem the user fixes by changing configuration; the message says what and how."""


log = logging.getLogger("signalbox.launcher")  # not __name__: "__main__" under python -m
# Lines a child wrote outside logging, wrapped as records of that child in json (Launcher.relay).
output_log = logging.getLogger("signalbox.output")
LAUNCHER = "launcher"  # the launcher's own SIGNALBOX_PROCESS


def say(message: str) -> None:
    """A line of the `test` command (not a log: it runs no children)."""
    print(f"signalbox: {message}", flush=True)


def fail(message: str, fmt: str | None = None) -> None:
    """The run's last word (a configuration mistake, a crash loop): one line on stderr, `signalbox: error:
    ...` in text, a JSON record at ERROR in json (`fmt`, else SIGNALBOX_LOG_FORMAT's)."""
    if (fmt or os.environ.get("SIGNALBOX_LOG_FORMAT", "")).strip().lower() == "json":
        record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
        logs.ProcessName().filter(record)
        line = logs.json_formatter().format(record)
    else:
        line = f"signalbox: error: {message}"
    print(line, file=sys.stderr, flush=True)


def one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def redact(url: str) -> str:
    """The URL without its password, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def _env_int(name: str, default: int, minimum: int = 1, maximum: int = 65535) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name}={raw!r} is not a number from {minimum} to {maximum}; fix or unset it")
    return value


def _env_seconds(name: str, default: float, maximum: float = 3600.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= maximum:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds above 0 and at most {maximum:g}; "
                          "fix or unset it")
    return value


@dataclass(frozen=True)
class RestartPolicy:
    """How `run` restarts a child that exits on its own. The n-th exit of a child within `window` seconds
    waits `delay * 2**(n-1)` seconds (at most `max_delay`) before the restart; an exit after `limit`
    restarts within the window is a crash loop, and the run ends. Exits spread out (fewer than `limit`
    per window) are restarted for ever, each after the first delay again."""

    delay: float = 0.5  # SIGNALBOX_RESTART_DELAY
    max_delay: float = 30.0  # SIGNALBOX_RESTART_MAX_DELAY
    limit: int = 5  # SIGNALBOX_RESTART_LIMIT
    window: float = 60.0  # SIGNALBOX_RESTART_WINDOW

    @classmethod
    def from_env(cls) -> RestartPolicy:
        return cls(
            delay=_env_seconds("SIGNALBOX_RESTART_DELAY", cls.delay),
            max_delay=_env_seconds("SIGNALBOX_RESTART_MAX_DELAY", cls.max_delay),
            limit=_env_int("SIGNALBOX_RESTART_LIMIT", cls.limit, maximum=1000),
            window=_env_seconds("SIGNALBOX_RESTART_WINDOW", cls.window, maximum=86400.0),
        )

    def backoff(self, exits: int) -> float:
        return min(self.max_delay, self.delay * 2 ** (exits - 1))


@dataclass
class RunConfig:
    data_dir: Path
    host: str
    port: int
    redis_url: str | None
    redis_port: int
    appendfsync: str
    worker_concurrency: int
    shutdown_timeout: float
    stomp_port: int = 61613  # 0: no STOMP over TCP listener
    stomp_ws_port: int = 61614  # 0: no STOMP over WebSocket on a port of its own
    # stomp+ssl and wss: set when a certificate and key are configured (0: not that one)
    stomp_tls_port: int | None = None
    stomp_wss_port: int | None = None
    redis_server: str = field(default_factory=configured_executable)  # the embedded server's binary
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    # the embedded server's maxmemory: SIGNALBOX_REDIS_MAXMEMORY, else half the machine's memory
    maxmemory: str = field(default_factory=lambda: maxmemory_setting(None))

    @classmethod
    def from_env(cls, args: argparse.Namespace) -> RunConfig:
        data_dir = Path(args.data_dir or os.environ.get("SIGNALBOX_DATA_DIR") or BASE_DIR / "var")
        appendfsync = os.environ.get("SIGNALBOX_REDIS_APPENDFSYNC") or DEFAULT_APPENDFSYNC
        if appendfsync not in APPENDFSYNC_POLICIES:
            raise ConfigError(
                f"SIGNALBOX_REDIS_APPENDFSYNC={appendfsync!r} is not a Redis fsync policy; "
                f"use one of {', '.join(APPENDFSYNC_POLICIES)}"
            )
        try:
            maxmemory = maxmemory_setting(os.environ.get("SIGNALBOX_REDIS_MAXMEMORY"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        port = args.port if args.port is not None else _env_int("SIGNALBOX_PORT", 8000)
        redis_server = configured_executable()
        if not (os.path.isfile(redis_server) and os.access(redis_server, os.X_OK)):
            raise ConfigError(
                f"SIGNALBOX_REDIS_SERVER={redis_server!r} is not an executable file; give the path of a "
                "redis-server binary (6.2 or newer), or unset it to use the embedded one"
            )
        cert, key = (os.environ.get(f"SIGNALBOX_STOMP_TLS_{part}") or "" for part in ("CERT", "KEY"))
        if bool(cert) != bool(key):  # (else the listener refuses to start, again and again: a crash loop)
            given = "SIGNALBOX_STOMP_TLS_CERT" if cert else "SIGNALBOX_STOMP_TLS_KEY"
            raise ConfigError("stomp+ssl needs both SIGNALBOX_STOMP_TLS_CERT and SIGNALBOX_STOMP_TLS_KEY; "
                              f"only {given} is set")
        for name, path in (("SIGNALBOX_STOMP_TLS_CERT", cert), ("SIGNALBOX_STOMP_TLS_KEY", key)):
            if path and not Path(path).expanduser().is_file():
                raise ConfigError(f"{name}={path!r} is not a file; give the PEM file's path or unset it")
        return cls(
            data_dir=data_dir.expanduser().resolve(),
            host=args.host or os.environ.get("SIGNALBOX_HOST") or "127.0.0.1",
            port=port,
            redis_url=os.environ.get("REDIS_URL") or None,
            redis_port=_env_int("SIGNALBOX_REDIS_PORT", 6390),
            redis_server=redis_server,
            appendfsync=appendfsync,
            maxmemory=maxmemory,
            worker_concurrency=_env_int("SIGNALBOX_WORKER_CONCURRENCY", 2, maximum=64),
            shutdown_timeout=float(_env_int("SIGNALBOX_SHUTDOWN_TIMEOUT", 20, maximum=3600)),
            restart=RestartPolicy.from_env(),
            stomp_port=_env_int("SIGNALBOX_STOMP_PORT", 61613, minimum=0),
            stomp_ws_port=_env_int("SIGNALBOX_STOMP_WS_PORT", 61614, minimum=0),
            stomp_tls_port=_env_int("SIGNALBOX_STOMP_TLS_PORT", 61612, minimum=0) if cert else None,
            stomp_wss_port=_env_int("SIGNALBOX_STOMP_WSS_PORT", 61619, minimum=0) if cert else None,
        )


def _is_json_object(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


@dataclass
class Child:
    """A supervised process: `spawn` starts it (again), `exits` holds when it last exited on its own."""

    name: str
    spawn: Callable[[], subprocess.Popen[bytes]]
    process: subprocess.Popen[bytes]
    exits: deque[float] = field(default_factory=deque)
    restart_at: float | None = None  # a restart is due then

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the child's process group (pool processes, a Redis rewrite fork)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


@dataclass
class Launcher:
    config: RunConfig
    stop_requested: threading.Event = field(default_factory=threading.Event)
    redis_server: EmbeddedRedis | None = None
    redis_child: Child | None = None  # the embedded Redis, supervised like the others but stopped last
    children: list[Child] = field(default_factory=list)
    lock_file: IO[str] | None = None
    relays: list[threading.Thread] = field(default_factory=list)  # threads writing out children's output

    # --- preflight: every check that can fail on configuration runs before anything starts ---

    def lock_data_dir(self) -> None:
        data_dir = self.config.data_dir
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self.lock_file = open(data_dir / "launcher.lock", "a+")  # noqa: SIM115 - held for the run
        except OSError as exc:
            raise ConfigError(
                f"cannot use data folder {data_dir} ({exc.strerror}); "
                "set SIGNALBOX_DATA_DIR to a folder you can write to"
            ) from None
        try:
            fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another Signalbox run is using data folder {data_dir}; stop it first "
                "or give this one its own folder with --data-dir or SIGNALBOX_DATA_DIR"
            ) from None

    def stomp_ports(self) -> list[tuple[int, str]]:
        """The STOMP listener's ports that are on, each with the setting that names it."""
        config = self.config
        ports = ((config.stomp_port, "SIGNALBOX_STOMP_PORT"),
                 (config.stomp_ws_port, "SIGNALBOX_STOMP_WS_PORT"),
                 (config.stomp_tls_port, "SIGNALBOX_STOMP_TLS_PORT"),
                 (config.stomp_wss_port, "SIGNALBOX_STOMP_WSS_PORT"))
        return [(port, name) for port, name in ports if port]

    def check_ports(self) -> None:
        config = self.config
        if port_in_use(config.host, config.port):
            raise ConfigError(
                f"port {config.port} on {config.host} is already in use, so the web server cannot listen "
                "there; stop the program using it or choose another port with --port or SIGNALBOX_PORT"
            )
        for port, name in self.stomp_ports():
            if port_in_use(config.host, port):
                raise ConfigError(
                    f"port {port} on {config.host} is already in use, so the STOMP listener cannot listen "
                    f"there; stop the program using it (an ActiveMQ?), or choose another port with {name} "
                    "(0: none)"
                )
        if config.redis_url is None and port_in_use("127.0.0.1", config.redis_port):
            raise ConfigError(
                f"port {config.redis_port} on 127.0.0.1 is already in use, so the embedded Redis cannot "
                "listen there; stop the program using it, choose another port with SIGNALBOX_REDIS_PORT, "
                "or set REDIS_URL to use a running Redis"
            )

    def check_external_redis(self, url: str) -> None:
        shown = redact(url)
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        except ValueError as exc:
            raise ConfigError(
                f"REDIS_URL={shown!r} is not a Redis URL ({one_line(exc)}); use e.g. "
                "redis://127.0.0.1:6379/0, or unset REDIS_URL to use the embedded Redis"
            ) from None
        try:
            info = client.info("server")
        except redis.AuthenticationError as exc:
            raise ConfigError(
                f"Redis at {shown} rejected the credentials in REDIS_URL ({one_line(exc)}); "
                "fix the user/password in REDIS_URL"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ConfigError(
                f"cannot reach Redis at {shown} from REDIS_URL ({one_line(exc)}); start that Redis, "
                "fix REDIS_URL, or unset REDIS_URL to use the embedded Redis"
            ) from None
        except redis.RedisError as exc:
            raise ConfigError(f"Redis at {shown} (REDIS_URL) refused INFO ({one_line(exc)})") from None
        finally:
            client.close()
        version = str(info.get("redis_version", "0"))
        if tuple(int(part) for part in version.split(".")[:2]) < MIN_REDIS_VERSION:
            raise ConfigError(
                f"Redis at {shown} is version {version}; Signalbox needs Redis 6.2 or newer, "
                "so upgrade it or unset REDIS_URL to use the embedded Redis"
            )
        log.info(f"using Redis {version} at {shown} (REDIS_URL)")

    def check_database_url(self) -> None:
        url = os.environ.get("DATABASE_URL")
        if not url:
            return
        try:
            dj_database_url.parse(url)
        except ValueError as exc:
            raise ConfigError(
                f"DATABASE_URL is not a database URL ({one_line(exc).split(' Did you')[0]}); use e.g. "
                "postgres://user:password@host:5432/dbname, or unset it to use SQLite in the data folder"
            ) from None

    def report_metrics(self, base: str) -> None:
        """Whether GET /metrics answers, said once at start: a token too short to be used is a mistake to
        learn now, not from the first failed scrape."""
        from django.conf import settings

        from signalbox.settings import metrics_off

        off = metrics_off(settings.SIGNALBOX_METRICS_TOKEN)
        if off is None:
            log.info(f"metrics at http://{base}/metrics (Authorization: Bearer <SIGNALBOX_METRICS_TOKEN>)")
        elif settings.SIGNALBOX_METRICS_TOKEN:
            log.warning(off)
        else:
            log.info(off)

    def setup_django(self) -> None:
        import django
        from django.core.exceptions import ImproperlyConfigured

        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "signalbox.settings")
        try:
            django.setup()
        except ImproperlyConfigured as exc:
            raise ConfigError(
                f"the settings do not load ({one_line(exc)}); check DATABASE_URL, REDIS_URL and the "
                "SIGNALBOX_* variables"
            ) from None

    def check_database(self) -> None:
        from django.core.exceptions import ImproperlyConfigured
        from django.db import DatabaseError, connections

        connection = connections["default"]
        settings_dict = connection.settings_dict
        where = settings_dict["NAME"]
        if settings_dict.get("HOST"):
            where = f"{settings_dict['HOST']}:{settings_dict.get('PORT') or 'default port'}/{where}"
        source = "DATABASE_URL" if os.environ.get("DATABASE_URL") else "the default SQLite file"
        try:
            connection.ensure_connection()
        except (DatabaseError, ImproperlyConfigured) as exc:
            raise ConfigError(
                f"cannot connect to the {connection.vendor} database {where} from {source} "
                f"({one_line(exc)}); check that the server runs and the URL's host, user, password "
                "and database name are right, or unset DATABASE_URL to use SQLite"
            ) from None
        finally:
            connection.close()

    # --- start-up ---

    def embedded_redis(self) -> EmbeddedRedis:
        """The embedded server this configuration runs (not started)."""
        return EmbeddedRedis(
            self.config.data_dir, port=self.config.redis_port, appendfsync=self.config.appendfsync,
            executable=self.config.redis_server, maxmemory=self.config.maxmemory,
        )

    def start_redis(self) -> str:
        if self.config.redis_url:
            return self.config.redis_url
        server = self.redis_server = self.embedded_redis()
        try:
            server.start()
        except EmbeddedRedisError as exc:
            raise ConfigError(f"{exc}; check {server.log_path}") from None
        assert server.process is not None
        # A restart reuses the same config: port, data folder and AOF, so nothing acknowledged is lost.
        self.redis_child = Child("Redis", server.spawn, server.process)
        pid = server.process.pid
        log.info(f"embedded Redis at {server.url} (pid {pid}), AOF appendfsync={server.appendfsync}, "
                 f"data in {self.config.data_dir}", extra={"child": "Redis", "pid": pid})
        return server.url

    def migrate(self) -> None:
        from django.core.management import call_command
        from django.db import DatabaseError, connections
        from django.db.migrations.executor import MigrationExecutor

        connection = connections["default"]
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
        try:
            call_command("migrate", interactive=False, verbosity=0)
        except DatabaseError as exc:
            raise ConfigError(
                f"migrating the {connection.vendor} database failed ({one_line(exc)}); the user in "
                "DATABASE_URL needs rights to create tables"
            ) from None
        log.info(f"database ready ({connection.vendor}, {len(pending)} migration(s) applied)")

    def ensure_admin(self) -> None:
        from django.contrib.auth import get_user_model

        user_model = get_user_model()
        if user_model.objects.filter(is_superuser=True).exists():
            return
        username = os.environ.get("SIGNALBOX_ADMIN_USER") or "admin"
        password = os.environ.get("SIGNALBOX_ADMIN_PASSWORD")
        if user_model.objects.filter(username=username).exists():
            raise ConfigError(
                f"user {username!r} exists but is not an administrator; pick another name with "
                "SIGNALBOX_ADMIN_USER or run 'python manage.py createsuperuser'"
            )
        if password:
            user_model.objects.create_superuser(username, email="", password=password)
            log.info(f"created admin user {username!r} with the password from SIGNALBOX_ADMIN_PASSWORD")
        else:
            password = secrets.token_urlsafe(12)
            user_model.objects.create_superuser(username, email="", password=password)
            log.warning(f"created admin user {username!r} with password: {password} "
                        "(shown only this once; change it under /admin/)")

    def load_policies(self, redis_url: str) -> None:
        """Replace the destination policies, the broker-wide memory limits and the virtual destinations in
        Redis with the configuration file's, if there is one."""
        import redis
        from django.conf import settings

        from broker_core.broker import Broker, flow, virtual
        from broker_core.config.policy_map import load_policy_file
        from broker_core.errors import InvalidPolicy

        path = settings.SIGNALBOX_POLICY_FILE
        if not path:  # Redis keeps what it has: say what that is (an admin may have set some by the API)
            client = redis.Redis.from_url(redis_url)
            try:
                kept = Broker(client, settings.SIGNALBOX_NAMESPACE).policies.policy_map()
            except InvalidPolicy as exc:  # (each destination using it says so too)
                log.warning(f"destination policies in Redis: {one_line(exc)}")
                return
            finally:
                client.close()
            count = len(kept.entries)
            parts = [f"{count} entr{'y' if count == 1 else 'ies'}"] if count else []
            parts += ["a default entry"] if kept.default_attributes is not None else []
            log.info(f"destination policies: {' and '.join(parts)} kept in Redis (no SIGNALBOX_POLICY_FILE)"
                     if parts else "destination policies: ActiveMQ's defaults (no SIGNALBOX_POLICY_FILE)")
            return
        try:
            policy_map = load_policy_file(path)
            usage = load_system_usage(path)
            virtual_config = load_virtual_config(path)
        except (OSError, InvalidPolicy) as exc:
            raise ConfigError(
                f"policy file {path}: {one_line(exc)}; fix it or unset SIGNALBOX_POLICY_FILE") from None
        client = redis.Redis.from_url(redis_url)
        try:
            broker = Broker(client, settings.SIGNALBOX_NAMESPACE)
            broker.policies.load_from(policy_map)
            broker.refresh_policies()
            flow.configure(broker, usage)
            virtual.configure(broker, virtual_config)
        finally:
            client.close()
        log.info(f"destination policies: {len(policy_map.entries)} entries from {path}; broker memory limit "
            f"{usage.memory_limit} bytes")

    def child_env(self, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        if not env.get("PROMETHEUS_MULTIPROC_DIR"):
            # The web server and the STOMP listener count requests and frames in files here, which every
            # /metrics scrape sums (docs/metrics.md); emptied at each start, so counters start at zero.
            shared = self.config.data_dir / "prometheus"
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(shared)
        env.update(
            REDIS_URL=redis_url,
            SIGNALBOX_DATA_DIR=str(self.config.data_dir),
            DJANGO_SETTINGS_MODULE=env.get("DJANGO_SETTINGS_MODULE", "signalbox.settings"),
            PYTHONUNBUFFERED="1",
        )
        return env

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        env = {**env, "SIGNALBOX_PROCESS": name}

        def start() -> subprocess.Popen[bytes]:
            process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                # Own process group: the launcher alone receives Ctrl-C and decides the shutdown order.
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
            relay = threading.Thread(target=self.relay, args=(name, process.stdout), daemon=True,
                                     name=f"output of {name}")
            relay.start()
            self.relays.append(relay)
            log.info(f"{name} started (pid {process.pid})", extra={"child": name, "pid": process.pid})
            return process

        self.children.append(Child(name, start, start()))

    def relay(self, name: str, stream: IO[bytes]) -> None:
        """Write a child's output lines to ours. A line not already in the run's format (a JSON object, or
        a text line of logs.TEXT_FORMAT: one printed outside logging, such as Celery's "Warm shutdown")
        becomes a record of that child; blank lines are dropped."""
        as_json = os.environ.get("SIGNALBOX_LOG_FORMAT") == "json"
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if not line.strip():
                    continue
                if not (_is_json_object(line) if as_json else logs.TEXT_LINE_START.match(line)):
                    output_log.info(line, extra={"process_name": name})
                    continue
                # Keep reading when our stdout is gone (a closed pipe): a child must not block on its output.
                with contextlib.suppress(OSError, ValueError):
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()

    def start_children(self, redis_url: str) -> None:
        config = self.config
        env = self.child_env(redis_url)
        python = sys.executable
        # uvicorn configures logging before it imports the app (and Django with it); give it ours, so its
        # first line is already in the run's format. Rewritten at every start from the current settings.
        log_config = config.data_dir / "logging.json"
        log_config.write_text(json.dumps(logs.config(), indent=1) + "\n")
        self.spawn(
            "celery worker",
            # --quiet: no banner (the launcher's lines say what started); levels and format: signalbox/logs.py
            # --without-gossip: nothing uses the workers' gossip (health pings go through remote control),
            # and on a lost connection its restart fails inside Celery, an ERROR with a traceback.
            [python, "-m", "celery", "-A", "signalbox", "--quiet", "worker", "--without-gossip",
             "--concurrency", str(config.worker_concurrency),
             "--hostname", f"signalbox-{os.getpid()}@%h"],
            env,
        )  # fmt: skip
        self.spawn(
            "celery beat",
            [python, "-m", "celery", "-A", "signalbox", "--quiet", "beat",
             "--schedule", str(config.data_dir / "celerybeat-schedule"),
             "--pidfile", str(config.data_dir / "celerybeat.pid")],
            env,
        )  # fmt: skip
        # The access log shows at DEBUG only (logs.CHATTY); off, uvicorn also skips building each request's
        # line (the client address, the path quoted again) only for the logger to drop it.
        debug = logs.level_from(os.environ.get("SIGNALBOX_LOG_LEVEL")) == "DEBUG"
        access = [] if debug else ["--no-access-log"]
        self.spawn(
            "web server",
            [python, "-m", "uvicorn", "signalbox.asgi:application",
             "--host", config.host, "--port", str(config.port), "--ws", WEB_SOCKET_PROTOCOL,
             "--lifespan", "off", "--timeout-graceful-shutdown", "5", "--log-config", str(log_config),
             *access],
            env,
        )  # fmt: skip
        if self.stomp_ports():
            self.spawn(
                "STOMP listener",
                [python, "-m", "django", "stomp_listener", "--host", config.host,
                 "--port", str(config.stomp_port), "--ws-port", str(config.stomp_ws_port),
                 "--tls-port", str(config.stomp_tls_port or 0),
                 "--wss-port", str(config.stomp_wss_port or 0)],
                env,
            )  # fmt: skip

    def wait_for_web_server(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            self.supervise()  # (a child that exits is restarted: no wait_for_port, which gives up then)
            if port_open(self.config.host, self.config.port):
                return
            time.sleep(0.1)
        if not self.stop_requested.is_set():
            raise ConfigError(f"the web server did not open port {self.config.port} within {timeout:.0f}s")

    def supervise(self) -> None:
        """Restart children that exited on their own, after their back-off; ChildExited on a crash loop."""
        policy = self.config.restart
        now = time.monotonic()
        for child in ([self.redis_child] if self.redis_child else []) + self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at = None
                    child.process = child.spawn()
                    if child is self.redis_child:  # the others say so in Launcher.spawn
                        log.info(f"Redis started (pid {child.process.pid})",
                                 extra={"child": "Redis", "pid": child.process.pid})
                continue
            code = child.process.poll()
            if code is None:
                continue
            child.kill_group()
            child.exits.append(now)
            while child.exits and child.exits[0] < now - policy.window:
                child.exits.popleft()
            exits = len(child.exits)
            if exits > policy.limit:
                raise ChildExited(
                    f"{child.name} exited {exits} times within {policy.window:g} s "
                    f"(last: {exit_text(code)}), a crash loop; giving up (see its output above; "
                    f"SIGNALBOX_RESTART_LIMIT={policy.limit}, SIGNALBOX_RESTART_WINDOW={policy.window:g})"
                )
            delay = policy.backoff(exits)
            child.restart_at = now + delay
            log.warning(f"{child.name} exited unexpectedly ({exit_text(code)}); restarting it in {delay:g} s "
                        f"(restart {exits} of at most {policy.limit} within {policy.window:g} s)",
                        extra={"child": child.name, "exit": exit_text(code), "restart_in": delay})

    # --- running and stopping ---

    def request_stop(self, signum: int, frame: object) -> None:
        self.stop_requested.set()

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self.request_stop)
        try:
            self.lock_data_dir()
            self.check_ports()
            warn_if_root()
            self.check_database_url()
            if self.config.redis_url:
                self.check_external_redis(self.config.redis_url)
            else:
                # Settings read REDIS_URL when imported, so export the embedded URL before Django loads.
                os.environ["REDIS_URL"] = self.embedded_redis().url
            os.environ["SIGNALBOX_DATA_DIR"] = str(self.config.data_dir)
            self.setup_django()
            self.check_database()
            redis_url = self.start_redis()
            self.migrate()
            self.ensure_admin()
            self.load_policies(redis_url)
            from django.db import connections

            connections.close_all()
            if self.stop_requested.is_set():
                return 0
            self.start_children(redis_url)
            self.wait_for_web_server()
            if not self.stop_requested.is_set():
                base = f"{self.config.host}:{self.config.port}"
                log.info(f"running at http://{base}/ (health: /healthz, WebSocket: ws://{base}/ws/ping); "
                         "press Ctrl-C to stop")
                self.report_metrics(base)
            while not self.stop_requested.wait(0.1):
                self.supervise()
            return 0
        except ConfigError as exc:
            fail(one_line(exc))
            return 2
        except ChildExited as exc:
            fail(str(exc))
            return 1
        finally:
            # A second Ctrl-C must not interrupt the orderly shutdown; its timeouts bound it anyway.
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            self.shutdown()

    def shutdown(self) -> None:
        running = [child for child in self.children if child.alive()]
        if running or (self.redis_server and self.redis_server.process):
            names = [c.name for c in running] + (["Redis"] if self.redis_server else [])
            log.info("stopping " + ", ".join(names))
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.shutdown_timeout
        for child in self.children:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(f"{child.name} did not stop within {self.config.shutdown_timeout:.0f}s; "
                            "killing it")
            # Kill whatever is left in the child's process group (e.g. orphaned pool processes).
            child.kill_group()
            code = child.process.wait()
            if child in running:
                # ended by the SIGTERM sent above (uvicorn raises it again once it has shut down): as asked
                text = "stopped by SIGTERM, as asked" if code == -signal.SIGTERM else exit_text(code)
                log.info(f"{child.name} exited ({text})", extra={"child": child.name, "exit": text})
        for relay in self.relays:  # the children's last lines before ours
            relay.join(timeout=max(0.1, deadline - time.monotonic()))
        if self.redis_server is not None and self.redis_server.process is not None:
            code = self.redis_server.stop(timeout=self.config.shutdown_timeout)
            log.info(f"Redis exited ({exit_text(code)})", extra={"child": "Redis", "exit": exit_text(code)})
        if running or self.redis_server:
            log.info("stopped")
        if self.lock_file is not None:
            self.lock_file.close()


def warn_if_root() -> None:
    """Every process of the run inherits the launcher's user. Said once, here, rather than by Celery at every
    worker start: the launcher does not switch users itself, since the data folder (database, secret key,
    AOF) belongs to whoever created it and a silent switch would leave files neither user can use."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        log.warning("running as root: the web server, the STOMP listener and the Celery worker all have "
                    "root's privileges; run Signalbox as an unprivileged user that owns the data folder "
                    "instead (e.g. sudo -u signalbox ./signalbox.sh run)")


class ChildExited(Exception):
    """A supervised process ended while Signalbox was meant to be running."""


def run_tests(pytest_args: list[str]) -> int:
    """The README's test command: the lint gate, then the whole pytest suite (e2e tests included)."""
    python = sys.executable
    say("ruff check")
    code = subprocess.call([python, "-m", "ruff", "check", "."], cwd=BASE_DIR)
    if code != 0:
        print("signalbox: error: ruff found problems (listed above); fix them first", file=sys.stderr)
        return code
    say("import contracts")
    lint_imports = Path(python).with_name("lint-imports")  # import-linter, contracts in pyproject.toml
    code = subprocess.call([str(lint_imports)], cwd=BASE_DIR)
    if code != 0:
        print("signalbox: error: an import breaks a contract of pyproject.toml (above)", file=sys.stderr)
        return code
    say("pytest")
    code = subprocess.call([python, "-m", "pytest", *pytest_args], cwd=BASE_DIR)
    if code == 5:
        print("signalbox: error: pytest collected no tests", file=sys.stderr)
    return code


class UsageError(Exception):
    """argparse refused the command line; the message names the option."""


class Arguments(argparse.ArgumentParser):
    """argparse's refusals (`--port eighty`, an unknown option) raise UsageError, so that `main` ends the
    run with its one line (`fail`) rather than argparse's usage block and a line that is no JSON record."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def given_log_format(argv: list[str]) -> str | None:
    """--log-format's value in the arguments, read without argparse (which refused them): how to say so."""
    for i, arg in enumerate(argv):
        if arg.startswith("--log-format="):
            return arg.partition("=")[2]
        if arg == "--log-format" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except UsageError as exc:
        fail(str(exc), given_log_format(argv))
        return 2


def _main(argv: list[str]) -> int:
    parser = Arguments(prog="signalbox", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run Redis (embedded unless REDIS_URL), the web server, the STOMP "
                               "listener, a Celery worker and beat")
    run.add_argument("--host", help="address of the web server (default 127.0.0.1, env SIGNALBOX_HOST)")
    run.add_argument("--port", type=int, help="port of the web server (default 8000, env SIGNALBOX_PORT)")
    run.add_argument("--data-dir", help="data folder (default ./var, env SIGNALBOX_DATA_DIR)")
    run.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR, for every process "
                                         "(default INFO, env SIGNALBOX_LOG_LEVEL)")
    run.add_argument("--log-format", help="text, or json: one JSON object per line, for log collectors "
                                          "(default text, env SIGNALBOX_LOG_FORMAT)")
    test = commands.add_parser("test", help="run ruff, the import contracts and the test suite; extra "
                                            "arguments go to pytest")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    # Options such as -q or -m belong to pytest; argparse's REMAINDER would reject a leading one.
    args, extra = parser.parse_known_args(argv)
    if args.command == "test":
        return run_tests(extra + args.pytest_args)
    if extra:
        run.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        configure_logging(args.log_level, args.log_format)
        config = RunConfig.from_env(args)
    except ConfigError as exc:
        fail(str(exc))
        return 2
    return Launcher(config).run()


def configure_logging(level: str | None, fmt: str | None) -> None:
    """The options win over the environment; both end up in the environment every child inherits."""
    try:
        level = logs.level_from(level, "--log-level") if level else logs.level_from(
            os.environ.get("SIGNALBOX_LOG_LEVEL"))
        fmt = logs.format_from(fmt, "--log-format") if fmt else logs.format_from(
            os.environ.get("SIGNALBOX_LOG_FORMAT"))
    except logs.LogSettingError as exc:
        os.environ.pop("SIGNALBOX_LOG_FORMAT", None)  # said in plain text: the format may be what is wrong
        raise ConfigError(str(exc) if str(exc).startswith("--") else f"{exc}; fix or unset it") from None
    os.environ.update(SIGNALBOX_LOG_LEVEL=level, SIGNALBOX_LOG_FORMAT=fmt, SIGNALBOX_PROCESS=LAUNCHER)
    logs.configure(level, fmt)


if __name__ == "__main__":
    sys.exit(main())
