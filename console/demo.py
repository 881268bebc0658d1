"""A throw-away Signalbox for the console's screenshots and benchmark: an embedded Redis (or REDIS_URL
with a fresh key namespace), a migrated SQLite database in a temporary folder with an admin user, and
uvicorn serving the project's ASGI app on a free port; with `celery=True` also a Celery worker and beat
(as `./signalbox.sh run` starts them, on a Celery queue of the demo's own), so the overview's health and
the node page show them running. Nothing of an existing deployment is touched.

    with DemoSystem() as system:
        system.broker.send("orders", ...)
        requests.get(f"{system.url}/console/")     # log in as system.user / system.password
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from broker_core.broker import Broker
from signalbox.embedded_redis import EmbeddedRedis, free_port
from signalbox.launcher import WEB_SOCKET_PROTOCOL

ROOT = Path(__file__).resolve().parent.parent
USER, PASSWORD = "admin", "demo-password"


class DemoSystem:
    def __init__(self, settings: str = "signalbox.settings", celery: bool = False) -> None:
        self.settings = settings
        self.celery = celery
        self.children: list[subprocess.Popen[bytes]] = []
        self.folder = Path(tempfile.mkdtemp(prefix="signalbox-demo-"))
        self.namespace = f"demo{uuid.uuid4().hex[:8]}"
        self.user, self.password = USER, PASSWORD
        self.redis_server: EmbeddedRedis | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(DJANGO_SETTINGS_MODULE=self.settings, SIGNALBOX_DATA_DIR=str(self.folder),
                   DATABASE_URL=f"sqlite:///{self.folder / 'db.sqlite3'}", SIGNALBOX_NAMESPACE=self.namespace,
                   REDIS_URL=self.redis_url, PYTHONPATH=str(ROOT), SIGNALBOX_CELERY_QUEUE=self.namespace)
        return env

    def __enter__(self) -> DemoSystem:
        if os.environ.get("REDIS_URL"):
            self.redis_url = os.environ["REDIS_URL"]
        else:
            self.redis_server = EmbeddedRedis(self.folder / "redis", port=free_port(), appendonly=False)
            self.redis_server.start()
            self.redis_url = self.redis_server.url
        self.redis = redis.Redis.from_url(self.redis_url)
        self.broker = Broker(self.redis, self.namespace)
        env = self.env()
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                       check=True)
        subprocess.run([sys.executable, "manage.py", "shell", "-c",
                        "from django.contrib.auth import get_user_model; get_user_model().objects."
                        f"create_superuser({self.user!r}, 'admin@example.com', {self.password!r})"],
                       cwd=ROOT, env=env, check=True)
        self.log = open(self.folder / "gateway.log", "wb")  # noqa: SIM115 - the child writes to it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "signalbox.asgi:application", "--host", "127.0.0.1", "--port",
             str(self.port), "--ws", WEB_SOCKET_PROTOCOL, "--lifespan", "off", "--log-level", "warning",
             "--no-access-log"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((self.folder / "gateway.log").read_text(errors="replace")) from None
                time.sleep(0.1)
        if self.celery:
            for args in (["worker", "--concurrency", "1", "--hostname", f"{self.namespace}@%h"],
                         ["beat", "--schedule", str(self.folder / "celerybeat-schedule")]):
                self.children.append(subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "signalbox", "--quiet", *args], cwd=ROOT, env=env,
                    stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT))
        return self

    def __exit__(self, *exc: Any) -> None:
        for child in self.children:
            child.terminate()
        for child in self.children:
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()
        if self.redis_server is None:  # a shared Redis: remove only this namespace's keys
            for key in self.redis.scan_iter(f"{self.namespace}:*", count=1000):
                self.redis.delete(key)
        else:
            self.redis_server.stop()
        self.redis.close()
        shutil.rmtree(self.folder, ignore_errors=True)
