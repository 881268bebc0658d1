"""STOMP over TCP (gateway/stomp/tcp.py, `manage.py stomp_listener`) with real sockets: what a byte stream
adds to the session the WebSocket endpoint shares (tests/gateway_ws/test_stomp_protocol.py runs every
stomp.py test over both): frames split anywhere and many per read, the frame limits, heart-beats, a
silent client, the connection limit, TLS, a listener killed mid-stream, and a client from npm."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.stomp.frames import Frame, encode
from tests.helpers.gateway_server import ROOT, wait_listening
from tests.helpers.polling import eventually, flooded_until_cut_off
from tests.helpers.stomp_client import Client, RawStomp, RawTcp

pytestmark = pytest.mark.e2e


@pytest.fixture
def raw(stomp_listener, closing):
    """Factory of hand-driven connections to the listener's TCP port (or `port`), closed at the end."""

    def make(port: int | None = None, tls: ssl.SSLContext | None = None) -> RawTcp:
        return closing(RawTcp(port or stomp_listener.port, tls))

    return make


def _q() -> str:
    return f"/queue/tcp{uuid.uuid4().hex[:10]}"


# -- framing ------------------------------------------------------------------------------------------

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=12),
       bodies=st.lists(st.binary(max_size=60), min_size=1, max_size=6))
def test_frames_split_anywhere_or_packed_together_arrive_whole_and_in_order(raw, cuts, bodies):
    """The same SEND frames written as one read, or cut at arbitrary places, give the same messages (bodies
    with NULs travel with content-length)."""
    conn = raw()
    conn.connect()
    dest = _q()
    stream = b"".join(encode("SEND", [("destination", dest), ("content-length", str(len(b)))], b)
                      for b in bodies)
    stream += encode("SUBSCRIBE", [("destination", dest), ("id", "s"), ("receipt", "sub")])
    start = 0
    for cut in cuts:
        conn.send_raw(stream[start:start + cut])
        start += cut
        time.sleep(0.001)
    conn.send_raw(stream[start:])
    conn.expect("RECEIPT")
    got = [conn.expect("MESSAGE").body for _ in bodies]
    assert got == bodies


def test_a_frame_sent_one_byte_at_a_time_is_one_frame(raw):
    conn = raw()
    conn.connect()
    for byte in encode("SUBSCRIBE", [("destination", _q()), ("id", "s"), ("receipt", "r1")]):
        conn.send_raw(bytes([byte]))
    assert conn.expect("RECEIPT").get("receipt-id") == "r1"


def test_a_send_before_a_bad_frame_in_the_same_read_is_still_sent(raw, stomp_listener, redis_client):
    from broker_core.broker import Broker

    dest = _q()
    conn = raw()
    conn.connect()
    conn.send_raw(encode("SEND", [("destination", dest)], b"kept") + b"SEND\nbad:\xff\n\n\x00")
    error = conn.expect("ERROR")
    assert error.get("message") == "Invalid UTF-8" and b"header line 1" in error.body
    assert conn.closed_within(5)
    broker = Broker(redis_client, stomp_listener.namespace)
    assert broker.stats(dest.removeprefix("/queue/")).queue_size == 1


def test_a_frame_over_the_body_limit_is_refused_with_an_error_that_names_it(raw):
    conn = raw()
    conn.connect()
    big = 11 * 1024 * 1024
    conn.send_raw(f"SEND\ndestination:{_q()}\ncontent-length:{big}\n\n".encode())
    error = conn.expect("ERROR")
    assert "10485760" in error.get("message", "") + error.body.decode(errors="replace")
    assert "(SIGNALBOX_STOMP_MAX_BODY)" in error.body.decode()
    assert conn.closed_within(5)


def test_before_connect_a_frame_may_be_only_as_large_as_a_connect_needs(raw):
    """Not logged in yet, a connection may not make the listener hold 10 MB (the whole frame buffered)."""
    conn = raw()
    conn.send_raw(f"SEND\ndestination:{_q()}\ncontent-length:{100 * 1024}\n\n".encode())
    error = conn.expect("ERROR")
    assert error.get("message") == "The maximum data length was exceeded"
    assert "exceeds the limit of 65536 bytes (the limit before CONNECT)" in error.body.decode()
    assert conn.closed_within(5)
    conn = raw()
    conn.send_raw(b"CONNECT\n" + b"".join(b"x-%d:y\n" % n for n in range(40)) + b"\n\x00")
    error = conn.expect("ERROR")
    assert "40 headers; the limit is 32 (the limit before CONNECT)" in error.body.decode(), error
    conn = raw()  # logged in, the settings' limits: the same 100 KiB frame is sent
    conn.connect()
    queue = _q()
    conn.send("SEND", {"destination": queue, "receipt": "big"}, b"x" * 100 * 1024)
    assert conn.expect("RECEIPT").get("receipt-id") == "big"


def test_a_client_that_never_sends_connect_is_cut_off(listener):
    server = listener(SIGNALBOX_STOMP_CONNECT_TIMEOUT="1")
    conn = RawTcp(server.port)
    try:
        conn.send_raw(b"CONN")  # slow loris: a frame that never ends
        assert conn.closed_within(6)
    finally:
        conn.close()


def test_missing_heart_beats_end_the_connection(raw):
    conn = raw()
    connected = conn.connect(**{"heart-beat": "200,0"})
    assert connected.get("heart-beat", "").split(",")[1] != "0"
    error = conn.expect("ERROR", timeout=5)
    assert "inactive" in error.get("message", "")
    assert conn.closed_within(5)


def _client(transport: str, port: int, tls: ssl.SSLContext | None = None) -> RawTcp | RawStomp:
    """A hand-driven client of the listener's `transport`: "tcp" (stomp, stomp+ssl) or "ws-port" (its
    WebSocket port: ws, wss)."""
    if transport == "tcp":
        return RawTcp(port, tls)
    return RawStomp(f"wss://localhost:{port}/stomp" if tls else f"ws://127.0.0.1:{port}/stomp", tls=tls)


@pytest.mark.parametrize("transport", ["tcp", "ws-port"])
def test_connections_beyond_the_limit_are_refused_with_an_error_that_names_it(listener, transport):
    server = listener(SIGNALBOX_STOMP_MAX_CONNECTIONS="2")
    port = server.port if transport == "tcp" else server.ws_port
    time.sleep(1)  # the probe connection that saw the listener up has been closed and counted out
    held = [_client(transport, port) for _ in range(2)]
    try:
        for conn in held:
            conn.connect()
        third = _client(transport, port)
        try:
            error = third.expect("ERROR")
            assert "SIGNALBOX_STOMP_MAX_CONNECTIONS" in error.get("message", "")
            assert third.closed_within(5)
        finally:
            third.close()
    finally:
        for conn in held:
            conn.close()


def test_a_burst_of_subscriptions_from_many_connections_is_served(stomp_listener):
    """150 connections subscribe at the same moment: more commands in flight at once than redis-py's pool
    has connections (100). They wait for one rather than fail ("Broker unavailable" while Redis is up)."""
    queue = _q()
    conns = [RawTcp(stomp_listener.port, timeout=30) for _ in range(150)]
    try:
        for conn in conns:
            conn.connect()
        for n, conn in enumerate(conns):  # all written before any answer is read
            conn.send("SUBSCRIBE", {"destination": f"/queue/{queue}.{n}", "id": "s", "receipt": f"r{n}"})
        for n, conn in enumerate(conns):
            assert conn.expect("RECEIPT").get("receipt-id") == f"r{n}"
    finally:
        for conn in conns:
            conn.close()


# -- TLS ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["tcp", "ws-port"])
def test_stomp_over_tls_round_trips_and_the_plain_port_serves_beside_it(listener, certificate, transport,
                                                                        gateway_data, redis_client):
    """stomp+ssl beside stomp; wss beside ws (the listener's WebSocket port); the connection registry
    names each connection's protocol, TLS or not."""
    from broker_core.broker import Broker
    from signalbox.embedded_redis import free_port

    cert, key = certificate
    tls_port = free_port()
    setting = "SIGNALBOX_STOMP_TLS_PORT" if transport == "tcp" else "SIGNALBOX_STOMP_WSS_PORT"
    server = listener(SIGNALBOX_STOMP_TLS_CERT=str(cert), SIGNALBOX_STOMP_TLS_KEY=str(key),
                      **{setting: str(tls_port)})
    wait_listening(type(server)(server.process, tls_port, server.log_path))
    context = ssl.create_default_context(cafile=str(cert))
    conn = _client(transport, tls_port, context)
    try:
        # named for its transport
        client_id = f"tls-{uuid.uuid4().hex[:8]}"
        assert conn.connect(**{"client-id": client_id}).get("session", "").startswith(
            "ssl-" if transport == "tcp" else "wss-")
        listed = Broker(redis_client, gateway_data[1]).connection_list(filters={"client": client_id}).items
        assert [c.protocol for c in listed] == ["stomp+ssl" if transport == "tcp" else "stomp+wss"]
        dest = _q()
        conn.send("SUBSCRIBE", {"destination": dest, "id": "s", "receipt": "sub"})
        conn.expect("RECEIPT")
        conn.send("SEND", {"destination": dest}, b"secret")
        assert conn.expect("MESSAGE").body == b"secret"
    finally:
        conn.close()
    plain = _client(transport, server.port if transport == "tcp" else server.ws_port)
    try:
        assert plain.connect().get("session", "").startswith("tcp-" if transport == "tcp" else "ws-")
    finally:
        plain.close()
    with pytest.raises(ssl.SSLError):  # no plain text on the TLS port
        _client(transport, tls_port, ssl.create_default_context()).connect()  # an untrusted certificate


@pytest.mark.parametrize("transport", ["tcp", "ws-port"])
def test_a_listener_killed_mid_stream_loses_nothing(listener, stomp_listener, redis_client, transport):
    """Messages a killed listener's client held unacknowledged come back when its lease lapses; with what
    the other listener's client acknowledges, every message is consumed exactly once. Over TCP and over the
    listener's WebSocket port (gateway/stomp/ws_port.py)."""
    from broker_core import maintenance
    from broker_core.broker import Broker

    tcp = transport == "tcp"
    doomed = listener(SIGNALBOX_WS_LEASE_MS="1500")
    dest = _q()
    sent = [f"m{i}" for i in range(40)]
    first = Client(doomed.port if tcp else doomed.ws_port, tcp=tcp).connect()
    first.conn.subscribe(dest, id="a", ack="client-individual", headers={"activemq.prefetchSize": "5"})
    port = stomp_listener.port if tcp else stomp_listener.ws_port
    producer = Client(port, tcp=tcp).connect()
    try:
        for body in sent:
            producer.conn.send(dest, body)
        window = first.messages(5)
        acked = []
        for frame in window[:2]:
            first.conn.ack(frame.headers["ack"], receipt=f"ack-{frame.body.decode()}")
            acked.append(frame.body.decode())
        receipts = 0
        while receipts < 2:  # the acks' receipts come among the messages that refill the window
            receipts += first.next().command == "RECEIPT"
        doomed.kill()  # the rest of its window is unacknowledged
        second = Client(port, tcp=tcp).connect()
        try:
            second.conn.subscribe(dest, id="b", ack="client-individual")
            broker = Broker(redis_client, stomp_listener.namespace)
            deadline = time.monotonic() + 30
            while len(acked) < len(sent) and time.monotonic() < deadline:
                maintenance.run_recovery(broker, f"queue://{dest.removeprefix('/queue/')}")
                try:
                    frame = second.expect("MESSAGE", timeout=0.5)
                except AssertionError:
                    continue
                second.conn.ack(frame.headers["ack"])
                acked.append(frame.body.decode())
            assert sorted(acked) == sorted(sent)  # each message once: none lost, none twice
            name = dest.removeprefix("/queue/")
            while broker.stats(name).dequeued < len(sent) and time.monotonic() < deadline:
                time.sleep(0.05)
            stats = broker.stats(name)
            assert (stats.enqueued, stats.dequeued, stats.queue_size) == (len(sent), len(sent), 0)
        finally:
            second.close()
    finally:
        first.close()
        producer.close()


def _browsing(server: Any, name: str) -> RawTcp:
    """A client of `server` with a queue browser open on queue `name`, its walk done (the end frame read)."""
    client = RawTcp(server.port)
    client.connect()
    client.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "b", "browser": "true", "receipt": "r"})
    client.expect("RECEIPT")
    assert client.expect("MESSAGE").get("browser") == "end"
    return client


def test_a_browser_of_a_killed_listener_stops_counting_once_its_lease_lapses(listener, stomp_listener,
                                                                              redis_client):
    """A queue browser counts among the queue's consumers (ActiveMQ's ConsumerCount) while its listener
    renews its lease; once that listener is killed it counts no more within about a lease, and the
    maintenance tick removes it."""
    from broker_core import maintenance
    from broker_core.broker import Broker

    doomed = listener(SIGNALBOX_WS_LEASE_MS="1500")
    name = _q().removeprefix("/queue/")
    client = _browsing(doomed, name)
    broker = Broker(redis_client, stomp_listener.namespace)
    time.sleep(2)  # past a lease: renewed, it still counts
    assert broker.stats(name).consumer_count == 1
    doomed.kill()
    client.close()
    eventually(lambda: broker.stats(name).consumer_count == 0, timeout=5)

    def removed() -> bool:
        maintenance.run_due(broker)
        return not list(redis_client.scan_iter(f"{stomp_listener.namespace}:*{name}*:browsers"))

    eventually(removed, timeout=5)


def test_a_browser_whose_listener_stalled_past_its_lease_counts_again(listener, stomp_listener, redis_client):
    """A listener stopped past its browsers' lease (a long GC pause, a stopped VM) finds them removed at its
    next renewal: they are still open for their clients, so they are counted again."""
    from broker_core import maintenance
    from broker_core.broker import Broker

    stalled = listener(SIGNALBOX_WS_LEASE_MS="1500")
    name = _q().removeprefix("/queue/")
    client = _browsing(stalled, name)
    broker = Broker(redis_client, stomp_listener.namespace)
    assert broker.stats(name).consumer_count == 1
    stalled.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2)  # past the lease
        maintenance.run_due(broker)  # removes it
        assert broker.stats(name).consumer_count == 0
    finally:
        stalled.process.send_signal(signal.SIGCONT)
    eventually(lambda: broker.stats(name).consumer_count == 1, timeout=5)
    client.close()


def test_a_slow_auto_ack_reader_cut_off_loses_nothing(listener, gateway_data, redis_client):
    """ack:auto, a client that reads nothing: the listener cuts it off as too slow. A message is
    acknowledged only once written (the client still reads those from its socket); what waited in the
    send buffer was not, and goes back to the queue (before, a send buffer's worth was acknowledged when
    put in the buffer, and dropped with it). Every message is acknowledged or back in the queue; some of a
    batch cut in the middle may have reached the client too (at least once, never lost)."""

    from broker_core.broker import Broker
    from gateway.stomp.frames import FrameParser

    server = listener(SIGNALBOX_WS_SLOW_CLIENT_SECONDS="2", SIGNALBOX_WS_SEND_BUFFER_BYTES="262144")
    name = _q().removeprefix("/queue/")
    sock = _unread_subscriber(server.port, name, "auto")
    time.sleep(0.5)  # subscribed
    producer = RawTcp(server.port, timeout=30)
    producer.connect()
    body = b"x" * 4096
    total = 3000
    for n in range(total):
        producer.send("SEND", {"destination": f"/queue/{name}", "persistent": "false",
                               **({"receipt": "last"} if n == total - 1 else {})}, body)
    assert producer.expect("RECEIPT").get("receipt-id") == "last"
    broker = Broker(redis_client, gateway_data[1])
    deadline = time.monotonic() + 30
    while broker.stats(name).consumer_count and time.monotonic() < deadline:  # cut off, consumer closed
        time.sleep(0.2)
    assert broker.stats(name).consumer_count == 0
    received, parser = 0, FrameParser("1.2")
    sock.settimeout(5)
    try:
        while data := sock.recv(65536):
            received += sum(frame.command == "MESSAGE" for frame in parser.feed(data))
    except (TimeoutError, ConnectionResetError):
        pass
    finally:
        sock.close()
        producer.close()
    stats = broker.stats(name)
    assert 0 < stats.dequeued <= received < total, (stats, received)
    assert stats.queue_size + stats.dequeued == total, stats


def test_a_transaction_of_a_killed_listener_ends_with_its_lease(listener, gateway_data, redis_client):
    """A listener killed while a client's transaction is open: the transaction lapses with the
    connection's lease (its key, and with it the space its sends reserved, spec §9.2), where it lived an
    hour and held every producer of a full broker back for that long."""
    from broker_core.broker import Broker

    namespace = gateway_data[1]
    doomed = listener(SIGNALBOX_WS_LEASE_MS="1500")
    name = _q().removeprefix("/queue/")
    client = RawTcp(doomed.port)
    client.connect()
    client.send("BEGIN", {"transaction": "t1"})
    client.send("SEND", {"destination": f"/queue/{name}", "transaction": "t1", "receipt": "r"}, b"x" * 1000)
    client.expect("RECEIPT")
    [key] = [k for k in redis_client.scan_iter(f"{namespace}:tx:*")
             if redis_client.lrange(k, 1, -1) and name.encode() in redis_client.lrange(k, 1, -1)[0]]
    time.sleep(2)  # past a lease: renewed, it is still open
    assert redis_client.exists(key) == 1
    reserved = f"{namespace}:usage:res"
    assert any(name.encode() in field for field in redis_client.hkeys(reserved))
    doomed.kill()
    client.close()
    deadline = time.monotonic() + 5
    while redis_client.exists(key) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert redis_client.exists(key) == 0
    Broker(redis_client, namespace).send(name, "after")  # reads the reservations: the lapsed one goes
    assert not any(name.encode() in field for field in redis_client.hkeys(reserved))
    assert Broker(redis_client, namespace).stats(name).queue_size == 1  # the transacted send never was


@pytest.mark.parametrize(("setting", "limit", "bodies", "refused", "spread"), [
    ("SIGNALBOX_MAX_TRANSACTION_SIZE", "3", [b"m"] * 3, b"m", False),
    # the bodies' bytes: UTF-8 text counts as stored (each "é" two bytes)
    ("SIGNALBOX_MAX_TRANSACTION_BYTES", "10", ["é".encode(), b"12345678"], b"x", False),
    # the destinations: each SEND to a queue of its own
    ("SIGNALBOX_MAX_TRANSACTION_DESTINATIONS", "2", [b"m"] * 2, b"m", True),
])
def test_a_transaction_past_its_limit_is_refused_and_never_commits_in_part(
        listener, gateway_data, redis_client, setting, limit, bodies, refused, spread):
    """A commit is one MULTI/EXEC that holds Redis for everyone: a transaction may hold at most
    SIGNALBOX_MAX_TRANSACTION_SIZE SENDs and ACKs (40,000 made a 4.7 s commit, every other client's SEND
    waiting), SIGNALBOX_MAX_TRANSACTION_BYTES of message bodies (50 of 1 MB held Redis 1.3 s) and
    SIGNALBOX_MAX_TRANSACTION_DESTINATIONS destinations and consumers (250 queues: 20-46 ms), and the
    refusal names the limit. The ERROR answers the SEND with a receipt alone (the transaction goes on, as
    after any refusal the client waited for); one refused without a receipt fails the COMMIT."""
    from broker_core.broker import Broker

    server = listener(**{setting: limit})
    name = _q().removeprefix("/queue/")
    conn = RawTcp(server.port)
    conn.connect()
    conn.send("BEGIN", {"transaction": "t"})
    for n, body in enumerate(bodies):
        dest = f"/queue/{name}" + (f".{n}" if spread and n else "")
        conn.send("SEND", {"destination": dest, "transaction": "t", "receipt": f"r{n}"}, body)
        assert conn.expect("RECEIPT").get("receipt-id") == f"r{n}"
    over = f"/queue/{name}" + (".over" if spread else "")
    conn.send("SEND", {"destination": over, "transaction": "t", "receipt": "over"}, refused)
    error = conn.expect("ERROR")
    assert error.get("message") == "Transaction too large"
    assert f"the limit is {limit} ({setting})" in error.body.decode()
    conn.send("SEND", {"destination": over, "transaction": "t"}, refused)
    assert conn.expect("ERROR").get("message") == "Transaction too large"
    conn.send("COMMIT", {"transaction": "t", "receipt": "commit"})
    error = conn.expect("ERROR")
    assert error.get("receipt-id") == "commit"
    assert error.get("message") == "COMMIT FAILED: Transaction marked rollback only xaErrorCode:100"
    assert "Transaction too large" in error.body.decode()
    conn.close()
    assert Broker(redis_client, gateway_data[1]).stats(name).enqueued == 0  # rolled back, all of it



def test_a_rollback_only_commit_gives_back_the_messages_its_acks_took(raw):
    """A COMMIT refused because a SEND of its transaction was refused unanswered (rollback-only) rolls the
    transaction back, its ERROR says, "the messages it ACKed redelivered". Its ACKs were held by the link
    until the COMMIT and never reached the broker, and the link forgot their ids: the acknowledged message
    stayed in flight with its consumer, for ever unacknowledgeable, and with activemq.prefetchSize:1 the
    subscription got nothing more once m2 was in. It comes again, redelivered, as after any commit that
    fails. (m2 comes at the transacted ACK already: the window grows there, as ActiveMQ's.)"""
    conn, _name, first = _acked_in_a_transaction(raw, b"m1", b"m2")
    conn.send("SEND", {"destination": "/remote-temp-queue/ID:tcp-0000000000000000:1", "transaction": "t"},
              b"refused")
    got: dict[bytes, Frame] = {}

    def take(frame: Frame) -> None:
        assert frame.command == "MESSAGE" and frame.body not in got, frame
        got[frame.body] = frame
        conn.send("ACK", {"id": frame.get("ack")})

    while (frame := conn.receive()).command != "ERROR":  # (m2 may come first: the transacted ACK's room)
        take(frame)
    conn.send("COMMIT", {"transaction": "t", "receipt": "commit"})
    while len(got) < 3:  # the COMMIT's ERROR, and both messages
        frame = conn.receive()
        if frame.command == "ERROR":
            assert frame.get("message") == "COMMIT FAILED: Transaction marked rollback only xaErrorCode:100"
            got[b"error"] = frame
        else:
            take(frame)
    assert got[b"m1"].get("redelivered") == "true", got[b"m1"]


def _acked_in_a_transaction(raw: Any, *bodies: bytes) -> tuple[RawTcp, str, Frame]:
    """A connection that sent `bodies` to a new queue, subscribed client-individual with prefetch 1, got
    the first and ACKed it in transaction `t`: the connection, the queue, that MESSAGE."""
    name = _q()
    conn = raw()
    conn.connect()
    for body in bodies:
        conn.send("SEND", {"destination": name, "receipt": body.decode()}, body)
        conn.expect("RECEIPT")
    conn.send("SUBSCRIBE", {"destination": name, "id": "s", "ack": "client-individual",
                            "activemq.prefetchSize": "1"})
    first = conn.expect("MESSAGE")
    assert first.body == bodies[0]
    conn.send("BEGIN", {"transaction": "t"})
    conn.send("ACK", {"id": first.get("ack"), "transaction": "t"})
    return conn, name, first


def test_an_abort_shrinks_a_client_individual_window_its_transacted_acks_grew(raw, stomp_listener,
                                                                             redis_client):
    """A transacted ACK grows the prefetch window at once; in client-individual mode the ABORT shrinks it
    back, as ActiveMQ's rollback of an individual ack does (PrefetchSubscription: afterRollback contracts
    the extension). It stayed grown: a client retrying a message (ACK in a transaction, ABORT, again) got
    one more message past its prefetch at each try. Here prefetch 1: m1, m2 at the first ACK; after the
    ABORT and the same ACK in a new transaction the window is 1 + 1 again, full with m1 and m2: m3 waits."""
    from broker_core.broker import Broker

    conn, name, first = _acked_in_a_transaction(raw, b"m1", b"m2", b"m3")
    assert conn.expect("MESSAGE").body == b"m2"  # the transacted ACK's room
    conn.send("ABORT", {"transaction": "t", "receipt": "ab"})
    conn.expect("RECEIPT")
    conn.send("BEGIN", {"transaction": "t2"})
    conn.send("ACK", {"id": first.get("ack"), "transaction": "t2", "receipt": "k"})
    conn.expect("RECEIPT")  # (a MESSAGE dispatched by this ACK's room is dispatched by its script call)
    stats = Broker(redis_client, stomp_listener.namespace).stats(name.removeprefix("/queue/"))
    assert (stats.in_flight, stats.pending) == (2, 1)


@pytest.mark.parametrize("ack", ["client", "client-individual"])
def test_committed_transacted_acks_leave_the_window_as_it_was(raw, stomp_listener, redis_client, ack):
    """A transacted ACK grows the window at once (the link's `delivered` ack); its COMMIT acknowledges and
    shrinks it back. The COMMIT's broker call grew it a second time (broker_core's transacted ack is
    itself a `delivered` ack, then the real one on commit), so each transaction committed left the window
    one message larger: after three, a prefetch-1 consumer held four unacknowledged messages."""
    from broker_core.broker import Broker

    name = _q()
    conn = raw()
    conn.connect()
    for n in range(8):
        conn.send("SEND", {"destination": name, "receipt": str(n)}, f"m{n}".encode())
        conn.expect("RECEIPT")
    conn.send("SUBSCRIBE", {"destination": name, "id": "s", "ack": ack, "activemq.prefetchSize": "1"})
    messages = [conn.expect("MESSAGE")]
    for n in range(3):
        frame = messages.pop(0)
        assert frame.body == f"m{n}".encode()
        conn.send("BEGIN", {"transaction": f"t{n}"})
        conn.send("ACK", {"id": frame.get("ack"), "transaction": f"t{n}"})
        conn.send("COMMIT", {"transaction": f"t{n}", "receipt": f"c{n}"})
        while (frame := conn.receive()).command != "RECEIPT":  # (the next MESSAGE comes at the ACK)
            assert frame.command == "MESSAGE", frame
            messages.append(frame)
    stats = Broker(redis_client, stomp_listener.namespace).stats(name.removeprefix("/queue/"))
    assert (stats.in_flight, stats.pending) == (1, 4)  # m3 in the window of 1; m4-m7 wait


def test_pipelined_sends_refused_part_way_are_never_stored_twice(raw, stomp_listener, redis_client):
    """Consecutive SENDs to one queue go to the broker in one call, stored in parts of 100; a part refused
    for memory after earlier parts were stored (sendFailIfNoSpace) raised, and the session sent every
    frame of the batch again one by one, each as a new message: the stored ones twice. Each SEND is stored
    once, or refused (its ERROR), and each frame gets exactly one answer."""
    from broker_core.broker import Broker
    from broker_core.messages import Message

    name = _q().removeprefix("/queue/")
    broker = Broker(redis_client, stomp_listener.namespace)
    broker.policies.set_entry("queue", name, {"memoryLimit": 150_000, "sendFailIfNoSpace": True})
    # a SEND that waits for room first, so that the SENDs behind it arrive meanwhile and go as one batch
    broker.policies.set_entry("queue", f"{name}.full", {"memoryLimit": 4_000,
                                                         "sendFailIfNoSpaceAfterTimeout": 1_000})
    broker.send(f"{name}.full", Message(body="x" * 3_000))
    conn = raw()
    conn.connect()
    total = 150
    conn.send_raw(encode("SEND", [("destination", f"/queue/{name}.full"), ("receipt", "wait")], b"y" * 3_000)
                  + b"".join(encode("SEND", [("destination", f"/queue/{name}"), ("receipt", str(n))],
                                    f"{n:04d}".encode() * 250) for n in range(total)))
    assert conn.expect("ERROR", timeout=10).get("receipt-id") == "wait"
    answers: dict[str, str] = {}
    while len(answers) < total:
        frame = conn.receive(timeout=10)
        receipt = frame.get("receipt-id")
        assert receipt is not None and receipt not in answers, frame
        answers[receipt] = frame.command
    stored = [m.message.body[:4] for m in _browse_all(broker, name)]
    assert len(stored) == len(set(stored)), f"{len(stored) - len(set(stored))} messages stored twice"
    assert sorted(stored) == sorted(f"{int(r):04d}" for r, c in answers.items() if c == "RECEIPT")
    assert 0 < len(stored) < total


def _browse_all(broker, name: str) -> list:
    out, cursor = [], None
    while True:
        page = broker.browse(name, cursor=cursor, limit=500)
        out += page.messages
        cursor = page.next_cursor
        if cursor is None:
            return out


def test_a_connection_holds_a_bounded_number_of_open_transactions(listener):
    """Each open transaction is a Redis key its connection renews with its leases, all in one MULTI/EXEC:
    a client that sent 100,000 BEGINs (3.5 MB of frames) had every renewal hold Redis 90-170 ms for every
    other client (a PING from another connection waited that long). At most SIGNALBOX_WS_MAX_TRANSACTIONS
    are open on a connection; one more BEGIN is refused, naming the setting, and the connection goes on."""
    server = listener(SIGNALBOX_WS_MAX_TRANSACTIONS="3")
    conn = RawTcp(server.port)
    conn.connect()
    for n in range(3):
        conn.send("BEGIN", {"transaction": f"t{n}", "receipt": f"b{n}"})
        assert conn.expect("RECEIPT").get("receipt-id") == f"b{n}"
    conn.send("BEGIN", {"transaction": "t3", "receipt": "over"})
    error = conn.expect("ERROR")
    assert (error.get("message"), error.get("receipt-id")) == ("Too many transactions", "over")
    assert "SIGNALBOX_WS_MAX_TRANSACTIONS" in error.body.decode() and "3" in error.body.decode()
    conn.send("COMMIT", {"transaction": "t3", "receipt": "c3"})  # it was never begun
    assert conn.expect("ERROR").get("message") == "Invalid transaction id: t3"
    conn.send("ABORT", {"transaction": "t0", "receipt": "a0"})
    assert conn.expect("RECEIPT").get("receipt-id") == "a0"
    conn.send("BEGIN", {"transaction": "t3", "receipt": "b3"})  # room again
    assert conn.expect("RECEIPT").get("receipt-id") == "b3"
    conn.close()


def test_a_client_that_reads_none_of_its_errors_is_cut_off_as_too_slow(listener, gateway_data, redis_client):
    """A refused frame's ERROR no longer closes the connection, so it waits in the send buffer like any
    frame: a client that sends frame after refused frame and reads nothing fills it. The ERROR's wait
    ended in SlowClient outside the handler that cuts a slow client off: the session's worker died, the
    connection stayed open reading nothing, and its subscription's consumer lived on. It is cut off as
    too slow, as for any frame, and its consumer closed."""

    from broker_core.broker import Broker

    server = listener(SIGNALBOX_WS_SLOW_CLIENT_SECONDS="1", SIGNALBOX_WS_SEND_BUFFER_BYTES="65536")
    name = _q().removeprefix("/queue/")
    broker = Broker(redis_client, gateway_data[1])
    broker.ensure_destination(name)
    sock = _unread_subscriber(server.port, name, "client-individual")
    eventually(lambda: broker.stats(name).consumer_count, timeout=10)
    bad = encode("ACK", [("id", "x" * 4000)], b"")  # each refused, its ERROR naming the id twice
    sock.settimeout(30)
    flooded_until_cut_off(sock.sendall, bad, 400, lambda: broker.stats(name).consumer_count)
    sock.close()


def test_a_subscribe_past_the_queues_consumer_limit_gets_an_error_naming_it(
        listener, gateway_data, redis_client):
    """SIGNALBOX_MAX_CONSUMERS (broker_core/model.py MAX_CONSUMERS): a queue's consumers bound what its
    dispatch reads. A SUBSCRIBE past it is refused with an ERROR naming the setting and its value, and the
    connection goes on (ActiveMQ's ProtocolConverter: a refused command does not end it)."""
    from broker_core.broker import Broker

    server = listener(SIGNALBOX_MAX_CONSUMERS="2")
    name = _q().removeprefix("/queue/")
    conn = RawTcp(server.port)
    conn.connect()
    for n in range(2):
        conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": f"s{n}", "receipt": f"r{n}"})
        assert conn.expect("RECEIPT").get("receipt-id") == f"r{n}"
    conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s2", "receipt": "over"})
    error = conn.expect("ERROR")
    assert error.get("receipt-id") == "over"
    assert "the limit is 2 (SIGNALBOX_MAX_CONSUMERS)" in error.get("message")
    assert Broker(redis_client, gateway_data[1]).stats(name).consumer_count == 2
    conn.send("UNSUBSCRIBE", {"id": "s0", "receipt": "gone"})
    assert conn.expect("RECEIPT").get("receipt-id") == "gone"
    conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s2", "receipt": "again"})
    assert conn.expect("RECEIPT").get("receipt-id") == "again"  # room again, on the same connection
    conn.close()


def test_a_transacted_client_ack_counts_every_message_it_covers(listener, gateway_data, redis_client):
    """A `client` mode ACK acknowledges every message its subscription was given up to the one it names
    (up to activemq.prefetchSize, 32,767), and a commit applies all of them in its one MULTI/EXEC: counted
    as one against SIGNALBOX_MAX_TRANSACTION_SIZE, a single ACK of 10,000 messages held Redis at
    least 66 ms (SLOWLOG) for every client. It counts as the messages it covers."""
    from broker_core.broker import Broker
    from broker_core.messages import Message

    server = listener(SIGNALBOX_MAX_TRANSACTION_SIZE="3")
    name = _q().removeprefix("/queue/")
    broker = Broker(redis_client, gateway_data[1])
    broker.send(name, [Message(body=f"m{n}") for n in range(5)])
    conn = RawTcp(server.port)
    conn.connect()
    conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s", "ack": "client"})
    ids = [conn.expect("MESSAGE").get("ack") for _ in range(5)]
    conn.send("BEGIN", {"transaction": "t"})
    conn.send("ACK", {"id": ids[1], "transaction": "t", "receipt": "two"})  # covers 2: within the limit
    assert conn.expect("RECEIPT").get("receipt-id") == "two"
    conn.send("ACK", {"id": ids[4], "transaction": "t", "receipt": "five"})  # 3 more: 5 in all
    error = conn.expect("ERROR")
    assert error.get("message") == "Transaction too large"
    assert "would hold 5 messages sent and acknowledged; the limit is 3" in error.body.decode()
    conn.send("ABORT", {"transaction": "t", "receipt": "abort"})  # (it went on: the ERROR answered the ACK)
    assert conn.expect("RECEIPT").get("receipt-id") == "abort"
    conn.close()
    deadline = time.monotonic() + 5
    while broker.stats(name).in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = broker.stats(name)
    assert (stats.dequeued, stats.queue_size) == (0, 5)  # aborted, then back with the connection: all


def test_auto_acked_messages_read_just_before_disconnect_are_not_redelivered(listener, gateway_data,
                                                                              tmp_path):
    """ack:auto: a message is acknowledged once written, by a call that may wait a millisecond for the
    next one under appendfsync always. A client that reads a MESSAGE and DISCONNECTs at once (take one
    and go) had that ack cancelled by the close, and the consumer's close gave the message back: the next
    consumer got it again. ActiveMQ acknowledges an auto-ack message at dispatch: never redelivered."""
    import redis

    from broker_core.broker import Broker
    from broker_core.messages import Message
    from signalbox.embedded_redis import EmbeddedRedis, free_port

    store = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendfsync="always")
    store.start()
    try:
        server = listener(REDIS_URL=store.url)
        broker = Broker(redis.Redis.from_url(store.url), gateway_data[1])
        name = _q().removeprefix("/queue/")
        rounds = 20
        for n in range(rounds):
            broker.send(name, Message(body=f"m{n}"))
            conn = RawTcp(server.port)
            conn.connect()
            conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s", "ack": "auto",
                                    "activemq.prefetchSize": "10"})
            message = conn.expect("MESSAGE")
            assert (message.body, message.get("redelivered")) == (f"m{n}".encode(), None), (n, message)
            conn.send("DISCONNECT", {"receipt": "bye"})
            conn.expect("RECEIPT")
            conn.close()
        stats = broker.stats(name)
        assert (stats.dequeued, stats.queue_size) == (rounds, 0), stats
    finally:
        store.stop()


def test_a_transaction_of_client_acks_of_each_message_commits_in_few_calls(listener, gateway_data,
                                                                           redis_client):
    """`client` mode, an ACK per message inside a transaction (as a client acknowledging each message it
    handled does): each ACK was a cumulative ack of its own, a step of its own in the commit's one
    MULTI/EXEC (500 of them: 80-120 ms of Redis, by SLOWLOG). The link knows which messages each ACK
    covers: the transaction acknowledges them by id, in calls of 100."""
    from broker_core.broker import Broker
    from broker_core.messages import Message

    def script_calls() -> int:
        stats = redis_client.info("commandstats")
        return sum(stats.get(f"cmdstat_{n}", {}).get("calls", 0) for n in ("evalsha", "eval", "fcall"))

    server = listener()
    name = _q().removeprefix("/queue/")
    broker = Broker(redis_client, gateway_data[1])
    broker.send(name, [Message(body=f"m{n}") for n in range(200)])
    conn = RawTcp(server.port)
    conn.connect()
    conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s", "ack": "client",
                            "activemq.prefetchSize": "200"})
    ids = [conn.expect("MESSAGE").get("ack") for _ in range(200)]
    conn.send("BEGIN", {"transaction": "t"})
    for ack_id in ids[:-1]:
        conn.send("ACK", {"id": ack_id, "transaction": "t"})
    conn.send("ACK", {"id": ids[-1], "transaction": "t", "receipt": "acked"})
    assert conn.expect("RECEIPT").get("receipt-id") == "acked"
    before = script_calls()
    conn.send("COMMIT", {"transaction": "t", "receipt": "done"})
    assert conn.expect("RECEIPT").get("receipt-id") == "done"
    assert script_calls() - before < 60, script_calls() - before
    stats = broker.stats(name)
    assert (stats.dequeued, stats.queue_size) == (200, 0), stats
    conn.close()


# -- a client in another language ---------------------------------------------------------------------

NODE_CLIENT = """
import { Client } from '@stomp/stompjs';
import { TCPWrapper } from '@stomp/tcp-wrapper';
const [port, dest] = process.argv.slice(2);
const client = new Client({
  webSocketFactory: () => new TCPWrapper('127.0.0.1', Number(port)),
  connectHeaders: { login: 'alice', passcode: 'secret' },
  reconnectDelay: 0,
  onStompError: (frame) => { console.error('ERROR', frame.headers.message); process.exit(2); },
});
client.onConnect = () => {
  const got = [];
  client.subscribe(dest, (message) => {
    got.push(message.body + ':' + message.headers['priority']);
    message.ack();
    if (got.length === 3) {
      console.log(JSON.stringify(got));
      client.deactivate().then(() => process.exit(0));
    }
  }, { ack: 'client-individual' });
  for (const n of [1, 2, 3]) client.publish({ destination: dest, body: 'hello ' + n });
};
client.activate();
setTimeout(() => { console.error('timed out'); process.exit(3); }, 20000);
"""


def test_a_nodejs_client_from_npm_sends_and_acknowledges_over_tcp(stomp_listener, redis_client, tmp_path):
    import json

    from broker_core.broker import Broker

    if not shutil.which("node") or not (ROOT / "node_modules" / "@stomp" / "tcp-wrapper").is_dir():
        pytest.skip("needs Node.js and the npm packages (./signalbox.sh test installs them)")
    script = ROOT / "node_modules" / f".stomp-tcp-{uuid.uuid4().hex[:8]}.mjs"  # resolves node_modules
    script.write_text(NODE_CLIENT)
    dest = _q()
    try:
        done = subprocess.run(["node", str(script), str(stomp_listener.port), dest], capture_output=True,
                              text=True, timeout=60)
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["hello 1:4", "hello 2:4", "hello 3:4"]
    stats = Broker(redis_client, stomp_listener.namespace).stats(dest.removeprefix("/queue/"))
    assert (stats.enqueued, stats.dequeued, stats.queue_size) == (3, 3, 0)


def test_a_client_whose_frames_wait_unread_is_not_taken_for_silent(raw, stomp_listener, redis_client):
    """Reading pauses while the session's inbox is full (1,000 frames waiting behind SENDs that wait for
    room, producer flow control): the client's heart-beats then wait in the socket, unread. That is no
    silence of the client's: ActiveMQ skips its read check while a command is being received
    (AbstractInactivityMonitor.readCheck, inReceive), and the connection must not end as inactive."""
    import threading

    from broker_core.broker import Broker
    from broker_core.messages import Message

    name = _q().removeprefix("/queue/")
    broker = Broker(redis_client, stomp_listener.namespace)
    broker.policies.set_entry("queue", name, {"memoryLimit": 4_000_000,
                                              "sendFailIfNoSpaceAfterTimeout": 30000})
    broker.send(name, [Message(body="x" * 975_000) for _ in range(4)])  # full: the SENDs below wait
    conn = raw()
    conn.connect(**{"heart-beat": "1000,0"})  # (silent for 1.5 s: inactive)
    frames = b"".join(encode("SEND", [("destination", f"/queue/{name}")], b"y") for _ in range(2000))
    frames += encode("SEND", [("destination", f"/queue/{name}"), ("receipt", "last")], b"y")
    stop = threading.Event()

    def beat() -> None:
        conn.sock.sendall(frames)
        while not stop.wait(0.05):
            conn.sock.sendall(b"\n")

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        time.sleep(5)  # heart-beat periods with reading paused
        broker.purge(name)  # room for all: the SENDs go on, and so does reading
        receipt = conn.expect("RECEIPT", timeout=20)
        assert receipt.get("receipt-id") == "last"
    finally:
        stop.set()
        beating.join(5)
    deadline = time.monotonic() + 10
    while broker.stats(name).enqueued < 2001 + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.stats(name).enqueued == 2001 + 4


def _unread_subscriber(port: int, queue: str, ack: str) -> socket.socket:
    """A raw STOMP connection subscribed to `queue` in `ack` mode that reads nothing: its socket offers a
    4 KiB receive window (set before connecting), so what the server writes soon backs up."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    connect = [("accept-version", "1.2"), ("login", "alice"), ("passcode", "secret"), ("host", "x")]
    subscribe = [("destination", f"/queue/{queue}"), ("id", "s"), ("ack", ack)]
    sock.sendall(encode("CONNECT", connect, b"") + encode("SUBSCRIBE", subscribe, b""))
    return sock


# -- transacted ACKs (gateway/ws/link.py `ack`, `commit`, `abort`) ------------------------------------------

def _subscribed(raw: Any, dest: str, ack: str, bodies: list[bytes],
                prefetch: int = 10) -> tuple[RawTcp, list[Frame]]:
    """A connection subscribed to `dest` (ack mode `ack`), then `bodies` sent to it by the same
    connection, each with a receipt, and their MESSAGEs."""
    conn = raw()
    conn.connect()
    conn.send("SUBSCRIBE", {"destination": dest, "id": "s", "ack": ack, "receipt": "sub",
                            "activemq.prefetchSize": str(prefetch)})
    conn.expect("RECEIPT")
    for body in bodies:
        conn.send("SEND", {"destination": dest, "receipt": body.decode()}, body)
    messages: list[Frame] = []
    receipts = 0
    while receipts < len(bodies) or len(messages) < min(prefetch, len(bodies)):
        frame = conn.receive()
        if frame.command == "RECEIPT":
            receipts += 1
        else:
            assert frame.command == "MESSAGE", frame
            messages.append(frame)
    return conn, messages


@pytest.mark.parametrize("ack", ["client", "client-individual"])
@pytest.mark.parametrize("end", ["COMMIT", "ABORT"])
def test_a_transacted_ack_on_a_topic_subscription_commits_or_aborts_as_on_a_queue(raw, stomp_listener,
                                                                                  redis_client, ack, end):
    """A transacted ACK of a topic subscription's message acknowledges it at COMMIT (the subscription's
    dequeued count, its window empty); at ABORT it stays delivered to the subscription, its ack id valid
    again (acknowledged by the next plain ACK), as a queue subscription's."""
    from broker_core.broker import Broker

    topic = f"/topic/tcp{uuid.uuid4().hex[:10]}"
    conn, (m1, m2) = _subscribed(raw, topic, ack, [b"m1", b"m2"])
    conn.send("BEGIN", {"transaction": "t"})
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "t"})
    conn.send("ACK", {"id": m2.get("ack"), "transaction": "t", "receipt": "acked"})
    conn.expect("RECEIPT")
    conn.send(end, {"transaction": "t", "receipt": "end"})
    assert conn.expect("RECEIPT").get("receipt-id") == "end"
    broker = Broker(redis_client, stomp_listener.namespace)
    (sub,) = broker.subscriptions(f"topic://{topic.removeprefix('/topic/')}")
    if end == "COMMIT":
        assert (sub.in_flight, sub.dequeued) == (0, 2), sub
        return
    assert (sub.in_flight, sub.dequeued) == (2, 0), sub
    with pytest.raises(TimeoutError):  # not delivered again to the live subscription
        conn.receive(0.3)
    for n, frame in enumerate((m1, m2)):
        conn.send("ACK", {"id": frame.get("ack"), "receipt": f"again{n}"})
        assert conn.expect("RECEIPT").get("receipt-id") == f"again{n}"
    (sub,) = broker.subscriptions(f"topic://{topic.removeprefix('/topic/')}")
    assert (sub.in_flight, sub.dequeued) == (0, 2), sub


@pytest.mark.parametrize("ack", ["client", "client-individual"])
def test_an_ack_of_a_message_another_open_transaction_acknowledged_names_that_transaction(
        raw, stomp_listener, redis_client, ack):
    """One message ACKed in transaction t1, then in t2: the second ACK is refused, saying the message is
    acknowledged in t1 already (it said only that the message was unexpected, as for an id never
    delivered), and nothing changes: t2 commits nothing, t1 commits the message."""
    from broker_core.broker import Broker

    name = _q()
    conn, (m1,) = _subscribed(raw, name, ack, [b"m1"])
    conn.send("BEGIN", {"transaction": "t1"})
    conn.send("BEGIN", {"transaction": "t2"})
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "t1", "receipt": "one"})
    assert conn.expect("RECEIPT").get("receipt-id") == "one"
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "t2", "receipt": "two"})
    error = conn.expect("ERROR")
    assert error.get("receipt-id") == "two"
    assert f"{m1.get('ack')}] is acknowledged in transaction t1 already" in error.body.decode(), error
    broker = Broker(redis_client, stomp_listener.namespace)
    stats = broker.stats(name.removeprefix("/queue/"))
    assert (stats.in_flight, stats.dequeued) == (1, 0)
    conn.send("COMMIT", {"transaction": "t2", "receipt": "c2"})
    assert conn.expect("RECEIPT").get("receipt-id") == "c2"
    assert broker.stats(name.removeprefix("/queue/")).dequeued == 0
    conn.send("COMMIT", {"transaction": "t1", "receipt": "c1"})
    assert conn.expect("RECEIPT").get("receipt-id") == "c1"
    stats = broker.stats(name.removeprefix("/queue/"))
    assert (stats.in_flight, stats.dequeued) == (0, 1)


def test_a_client_ack_in_a_transaction_then_unsubscribe_commits_and_the_message_is_redelivered(
        raw, stomp_listener, redis_client):
    """`client` mode, as ActiveMQ 5.17's STOMP: the transacted ACK is a DELIVERED ack at once and its
    cumulative ack goes to the broker at the COMMIT (StompSubscription.onStompCommit); an UNSUBSCRIBE in
    between returns the subscription's messages to the queue, and the COMMIT then succeeds (the ack of a
    consumer gone is ignored): the message comes again, redelivered, not refused by the COMMIT."""
    name = _q()
    conn, (m1, _m2) = _subscribed(raw, name, "client", [b"m1", b"m2"])
    conn.send("BEGIN", {"transaction": "t"})
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "t", "receipt": "acked"})
    conn.expect("RECEIPT")
    conn.send("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
    conn.expect("RECEIPT")
    conn.send("COMMIT", {"transaction": "t", "receipt": "c"})
    assert conn.expect("RECEIPT").get("receipt-id") == "c"
    other = raw()
    other.connect()
    other.send("SUBSCRIBE", {"destination": name, "id": "s2", "ack": "client-individual"})
    again = [other.expect("MESSAGE") for _ in range(2)]
    assert [(f.body, f.get("redelivered")) for f in again] == [(b"m1", "true"), (b"m2", "true")]


def test_a_durable_subscriber_s_transacted_ack_commits_after_it_went_offline(raw, stomp_listener):
    """`client-individual`, a durable subscription: the transacted ACK goes to the broker at once, as
    ActiveMQ 5.17's STOMP sends its INDIVIDUAL ack (StompSubscription.onStompMessageAck), and its broker
    acknowledges the message in the subscription's store within the transaction, whatever becomes of the
    subscriber. An UNSUBSCRIBE (without `activemq.subscriptionName`: the subscription goes offline) before
    the COMMIT: the message never comes back to the subscription; the one not acknowledged does."""
    topic = f"/topic/tcp{uuid.uuid4().hex[:10]}"
    durable = {"destination": topic, "id": "s", "ack": "client-individual", "activemq.subscriptionName": "s"}
    conn = raw()
    conn.connect(**{"client-id": f"app-{uuid.uuid4().hex[:8]}"})
    conn.send("SUBSCRIBE", {**durable, "receipt": "sub"})
    conn.expect("RECEIPT")
    for body in (b"m1", b"m2"):
        conn.send("SEND", {"destination": topic}, body)
    m1, _m2 = conn.expect("MESSAGE"), conn.expect("MESSAGE")
    conn.send("BEGIN", {"transaction": "t"})
    conn.send("ACK", {"id": m1.get("ack"), "transaction": "t"})
    conn.send("UNSUBSCRIBE", {"id": "s", "receipt": "u"})
    conn.expect("RECEIPT")
    conn.send("COMMIT", {"transaction": "t", "receipt": "c"})
    assert conn.expect("RECEIPT").get("receipt-id") == "c"
    conn.send("SUBSCRIBE", {**durable, "id": "s2"})
    again = conn.expect("MESSAGE")
    assert (again.body, again.get("redelivered")) == (b"m2", "true")
    with pytest.raises(TimeoutError):
        conn.receive(0.5)



def test_a_client_that_leaves_while_its_disconnect_closes_its_subscriptions_leaves_none_open(
        raw, stomp_listener, redis_client):
    """A client that reads its messages (ack:auto), sends DISCONNECT and closes its socket without waiting
    for the RECEIPT, as many do: the DISCONNECT's close waits for the auto acks on their way (up to 2 s),
    the socket's end cancelled the frame task in that wait, and the second close the socket's end started
    returned at once (the link was marked closed), so every subscription stayed open, its lease renewed
    for as long as the listener process lived (seen: 60 of 60; 13 of 21 after a stomp.py client's
    disconnect). Whoever starts the close and whatever is cancelled meanwhile, it runs to the end."""
    from broker_core.broker import Broker
    from broker_core.errors import UnknownDestination

    broker = Broker(redis_client, stomp_listener.namespace)
    topic = f"tcp{uuid.uuid4().hex[:10]}"
    subscriptions = 60
    for _ in range(3):
        conn = raw()
        conn.connect()
        for n in range(subscriptions):
            conn.send("SUBSCRIBE", {"destination": f"/topic/{topic}", "id": f"s{n}", "selector": "a = 'x'",
                                    **({"receipt": "all"} if n == subscriptions - 1 else {})})
        conn.expect("RECEIPT")
        conn.send("SEND", {"destination": f"/topic/{topic}", "a": "x"}, b"m")
        for _ in range(subscriptions):  # each acknowledged (ack:auto) once written: acks on their way
            conn.expect("MESSAGE")
        conn.send("DISCONNECT")
        conn.close()

    def consumers() -> int:
        try:
            return broker.stats(f"topic://{topic}").consumer_count
        except UnknownDestination:  # (a topic whose last subscription ended may be gone)
            return 0

    eventually(lambda: consumers() == 0, timeout=10)  # (a lease is 30 s, and a leaked one is renewed)


def test_a_subscribe_the_socket_s_end_interrupts_leaves_no_consumer_holding_messages(listener, gateway_data,
                                                                                     tmp_path):
    """A client that SUBSCRIBEs and closes its socket at once: the socket's end cancelled the frame task
    while the broker made the consumer (a write Redis answers once it is on disk: appendfsync always, as
    `run` starts it), the call went on in Redis, and the consumer it made was known to nobody, so nothing
    closed it: it held the queue's messages in flight (prefetch 1000) until its lease lapsed, 30 s (seen:
    5 of 5 messages, against ./signalbox.sh run). ActiveMQ removes a connection's consumers with its
    transport, at once."""
    import redis

    from broker_core.broker import Broker
    from broker_core.messages import Message
    from signalbox.embedded_redis import EmbeddedRedis, free_port

    store = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendfsync="always")
    store.start()
    try:
        server = listener(REDIS_URL=store.url)
        broker = Broker(redis.Redis.from_url(store.url), gateway_data[1])
        for _ in range(10):
            name = _q().removeprefix("/queue/")
            broker.send(name, [Message(body=f"m{n}") for n in range(5)])
            conn = RawTcp(server.port)
            conn.connect()
            conn.send("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s", "ack": "client"})
            conn.close()
            stats = eventually(lambda name=name: (s := broker.stats(name)).consumer_count == 0 and s,
                               timeout=5)  # (a lease is 30 s)
            assert (stats.in_flight, stats.queue_size) == (0, 5), stats
    finally:
        store.stop()
