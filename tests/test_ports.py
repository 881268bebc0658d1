"""signalbox.embedded_redis.wait_for_port: the one wait for a server's TCP port that the tests, the benches
and the launcher share. Against real sockets and real processes."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from signalbox.embedded_redis import PortNotOpen, free_port, port_open, wait_for_port


def test_it_returns_once_a_server_listens_on_the_port():
    port = free_port()
    server = socket.socket()

    def listen_later():
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Thread(target=listen_later).start()
    try:
        assert not port_open("127.0.0.1", port)
        start = time.monotonic()
        wait_for_port(port, timeout=5)
        assert 0.25 < time.monotonic() - start < 3
        assert port_open("127.0.0.1", port)
    finally:
        server.close()


def test_it_gives_up_at_once_when_the_process_that_should_listen_exits():
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    start = time.monotonic()
    with pytest.raises(PortNotOpen, match=re.escape("exited with 3 before listening on port")):
        wait_for_port(free_port(), process=process, timeout=30)
    assert time.monotonic() - start < 5


def test_it_names_the_port_and_the_time_when_nothing_listens():
    port = free_port()
    with pytest.raises(PortNotOpen, match=f"nothing listened on 127.0.0.1:{port} within 0.3 s"):
        wait_for_port(port, timeout=0.3)
