"""`manage.py stomp_listener [--host H] [--port P] [--ws-port P] [--tls-port P] [--wss-port P]`: serve STOMP
over TCP and over WebSocket on a port of its own (and stomp+ssl and wss when SIGNALBOX_STOMP_TLS_CERT and
_KEY are set) until stopped. `run` starts one as a supervised child; more may run on the same ports
(SO_REUSEPORT) or on other hosts against the same Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Coroutine
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.stomp.tcp import Connection, Listener, serve, tls_context
from gateway.stomp.ws_port import WsConnection

logger = logging.getLogger(__name__)


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the listener on uvloop when it is installed (uvicorn[standard] brings it, and the web server
    runs on it): its event loop and transports are in C, and one STOMP frame in and one out cost fewer
    microseconds there than on asyncio's own loop (docs/benchmarks.md, "Where a STOMP message's time
    goes"). Without it, asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


class Command(BaseCommand):
    help = "Serve STOMP over TCP and WebSocket (and TLS) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.SIGNALBOX_STOMP_HOST)
        parser.add_argument("--port", type=int, default=settings.SIGNALBOX_STOMP_PORT,
                            help="plain STOMP port (0: none)")
        parser.add_argument("--ws-port", type=int, default=settings.SIGNALBOX_STOMP_WS_PORT,
                            help="STOMP over WebSocket port (0: none)")
        parser.add_argument("--tls-port", type=int, default=settings.SIGNALBOX_STOMP_TLS_PORT,
                            help="stomp+ssl port, used when SIGNALBOX_STOMP_TLS_CERT and _KEY are set "
                                 "(0: none)")
        parser.add_argument("--wss-port", type=int, default=settings.SIGNALBOX_STOMP_WSS_PORT,
                            help="STOMP over secure WebSocket port, used when SIGNALBOX_STOMP_TLS_CERT "
                                 "and _KEY are set (0: none)")

    def handle(self, *args: object, host: str, port: int, ws_port: int, tls_port: int, wss_port: int,
               **options: object) -> None:
        listeners = self.listeners(host, {Connection: port, WsConnection: ws_port},
                                   {Connection: tls_port, WsConnection: wss_port})
        if not listeners:
            raise CommandError("nothing to serve: SIGNALBOX_STOMP_PORT and SIGNALBOX_STOMP_WS_PORT are 0 "
                               "and no TLS certificate is set")
        from signalbox import collector, node

        node.start_heartbeat("stomp", " ".join(listener.url for listener in listeners))
        collector.settle()
        try:
            run_loop(self.serve(listeners))
        finally:
            node.stop_heartbeat("stomp")

    def listeners(self, host: str, plain: dict[type[Connection], int], tls: dict[type[Connection], int]
                  ) -> list[Listener]:
        """A listener per port that is not 0: `plain`, and `tls` with a certificate; by kind of connection."""
        most = settings.SIGNALBOX_STOMP_MAX_CONNECTIONS
        listeners = [Listener(host, port, None, most, kind) for kind, port in plain.items() if port]
        cert, key = settings.SIGNALBOX_STOMP_TLS_CERT, settings.SIGNALBOX_STOMP_TLS_KEY
        if bool(cert) != bool(key):
            raise CommandError("stomp+ssl needs both SIGNALBOX_STOMP_TLS_CERT and SIGNALBOX_STOMP_TLS_KEY")
        if cert:
            try:
                context = tls_context(cert, key)
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot load the STOMP TLS certificate {cert} and key {key}: {exc}"
                                   ) from exc
            listeners += [Listener(host, port, context, most, kind) for kind, port in tls.items() if port]
        return listeners

    async def serve(self, listeners: list[Listener]) -> None:
        task = asyncio.ensure_future(serve(listeners))
        loop = asyncio.get_running_loop()

        def stop(signum: signal.Signals) -> None:
            # the listener then exits with status 0, which is all the launcher can tell: this line says why
            logger.info("STOMP listener stopping on %s: its connections end as DISCONNECT would", signum.name)
            task.cancel()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop, signum)
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        except OSError as exc:  # the port is taken, the address is not this host's, ...
            where = ", ".join(f"{listener.host}:{listener.port}" for listener in listeners)
            raise CommandError(f"cannot listen for STOMP on {where}: {exc.strerror or exc}") from exc
