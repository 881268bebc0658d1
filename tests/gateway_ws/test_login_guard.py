"""What a wrong password may cost (gateway/logins.py): failed password logins are limited per client
address, password checks are bounded per process, and logins presenting the same credentials share one
check. The guard itself with checks that wait for the test, then the socket logins in-process (Channels,
real Redis, Django's hasher counted) and over a real STOMP TCP listener."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY

from gateway.logins import LoginGuard, LoginRefused
from tests.helpers import hashers
from tests.helpers.channels import receive_json, send_json, websocket
from tests.helpers.stomp_channels import stomp

# -- the guard --------------------------------------------------------------------------------------------


def test_an_address_past_its_failures_is_refused_until_the_oldest_is_old_enough(settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 3
    settings.SIGNALBOX_LOGIN_FAILURE_SECONDS = 0.5
    guard = LoginGuard()
    ran: list[str] = []

    def verify(result):
        def run():
            ran.append("check")
            return result
        return run

    def counted(outcome: str) -> float:
        return REGISTRY.get_sample_value("signalbox_password_logins_total", {"outcome": outcome}) or 0.0

    before = {outcome: counted(outcome) for outcome in ("ok", "failed", "refused_failures")}
    for _ in range(3):
        assert guard.check("10.0.0.1", b"alice:wrong", verify(None)) is None
    with pytest.raises(LoginRefused) as refused:
        guard.check("10.0.0.1", b"alice:secret", verify("alice"))  # even the right password
    assert "Too many failed logins from 10.0.0.1: 3 in 0.5 s" in refused.value.message
    assert "(SIGNALBOX_LOGIN_FAILURES)" in refused.value.message
    assert refused.value.retry_after >= 1
    assert len(ran) == 3  # refused without a check
    assert {outcome: counted(outcome) - before[outcome] for outcome in before} == {
        "ok": 0, "failed": 3, "refused_failures": 1}  # (gateway/metrics.py)
    assert guard.check("10.0.0.2", b"alice:secret", verify("alice")) == "alice"  # another address
    time.sleep(0.55)
    assert guard.check("10.0.0.1", b"alice:secret", verify("alice")) == "alice"
    assert "10.0.0.1" not in guard.failures  # a success clears the address


def test_a_success_clears_the_failures_before_it(settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 3
    guard = LoginGuard()
    for _ in range(2):
        guard.check("10.0.0.1", b"x", lambda: None)
    guard.check("10.0.0.1", b"y", lambda: "alice")
    for _ in range(2):
        guard.check("10.0.0.1", b"x", lambda: None)
    assert guard.check("10.0.0.1", b"y", lambda: "alice") == "alice"


def test_no_limit_per_address_when_failures_is_zero(settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 0
    guard = LoginGuard()
    for _ in range(50):
        assert guard.check("10.0.0.1", b"x", lambda: None) is None
    assert not guard.failures


def test_the_addresses_followed_are_bounded(settings, monkeypatch):
    from gateway import logins

    monkeypatch.setattr(logins, "ADDRESSES", 5)
    guard = LoginGuard()
    for n in range(8):
        guard.check(f"10.0.0.{n}", b"x", lambda: None)
    assert list(guard.failures) == [f"10.0.0.{n}" for n in range(3, 8)]


def _in_thread(fn):
    """Run fn in a thread; (thread, outcome) where outcome gets 'result' or 'error'."""
    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _wait_until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class Held:
    """Password checks the test holds: each notes that it ran, then waits for its gate to open."""

    def __init__(self, *names: str) -> None:
        self.gates = {name: threading.Event() for name in names}
        self.order: list[str] = []

    def __call__(self, name: str, result=None):
        def run():
            self.order.append(name)
            self.gates[name].wait(5)
            return result
        return run

    def release(self) -> None:
        for gate in self.gates.values():
            gate.set()


def test_checks_run_one_at_a_time_and_a_login_past_the_queue_is_refused_at_once(settings):
    settings.SIGNALBOX_LOGIN_CONCURRENCY = 1
    settings.SIGNALBOX_LOGIN_QUEUE = 1
    guard = LoginGuard()
    release = threading.Event()
    running: list[str] = []

    def slow(name):
        def run():
            running.append(name)
            release.wait(5)
            return name
        return run

    first, first_outcome = _in_thread(lambda: guard.check("10.0.0.1", b"a", slow("a")))
    _wait_until(lambda: running == ["a"])
    second, second_outcome = _in_thread(lambda: guard.check("10.0.0.2", b"b", slow("b")))
    _wait_until(lambda: guard.waiting["unknown"] == 1)
    assert running == ["a"]  # the second waits for its turn
    with pytest.raises(LoginRefused) as refused:
        guard.check("10.0.0.3", b"c", slow("c"))
    assert refused.value.message == ("Too many logins at once: 1 being checked and 1 waiting; try again in a "
                                     "moment (SIGNALBOX_LOGIN_QUEUE)")
    release.set()
    first.join(5)
    second.join(5)
    assert first_outcome == {"result": "a"} and second_outcome == {"result": "b"}
    assert running == ["a", "b"]
    assert (guard.running, guard.waiting, guard.checks) == (0, {"known": 0, "unknown": 0, "suspect": 0}, {})


def test_a_login_from_an_address_that_never_failed_goes_first_and_has_a_queue_of_its_own(settings):
    """Addresses with failures wait behind the others, in a queue of their own."""
    settings.SIGNALBOX_LOGIN_CONCURRENCY = 1
    settings.SIGNALBOX_LOGIN_QUEUE = 1
    guard = LoginGuard()
    for attacker in ("10.9.0.1", "10.9.0.2"):
        guard.check(attacker, b"guess", lambda: None)  # one failure each: their logins are suspect now
    held = Held("first", "attacker", "good")
    first, _ = _in_thread(lambda: guard.check("10.0.0.1", b"first", held("first", "first")))
    _wait_until(lambda: held.order == ["first"])
    attacker, _ = _in_thread(lambda: guard.check("10.9.0.1", b"guess 2", held("attacker")))
    _wait_until(lambda: guard.waiting["suspect"] == 1)
    with pytest.raises(LoginRefused, match="SIGNALBOX_LOGIN_QUEUE"):  # the suspects' queue is full
        guard.check("10.9.0.2", b"guess 3", held("attacker"))
    good, good_outcome = _in_thread(lambda: guard.check("10.0.0.7", b"good", held("good", "good")))
    _wait_until(lambda: guard.waiting["unknown"] == 1)  # ... but not the others'
    held.release()
    for thread in (first, attacker, good):
        thread.join(5)
    assert held.order == ["first", "good", "attacker"]  # the good login went before the waiting suspect
    assert good_outcome == {"result": "good"}


def test_an_address_that_logged_in_before_goes_before_new_ones(settings):
    settings.SIGNALBOX_LOGIN_CONCURRENCY = 1
    guard = LoginGuard()
    guard.check("10.0.0.5", b"service:pw", lambda: "service")  # this host logged in before
    held = Held("first", "new 1", "new 2", "service")
    first, _ = _in_thread(lambda: guard.check("10.7.0.1", b"first", held("first")))
    _wait_until(lambda: held.order == ["first"])
    threads = [_in_thread(lambda n=n: guard.check(f"10.8.0.{n}", b"new %d" % n, held(f"new {n}")))[0]
               for n in (1, 2)]
    _wait_until(lambda: guard.waiting["unknown"] == 2)
    service, _ = _in_thread(lambda: guard.check("10.0.0.5", b"service:pw2", held("service")))
    _wait_until(lambda: guard.waiting["known"] == 1)
    held.release()
    for thread in (first, service, *threads):
        thread.join(5)
    assert held.order[:2] == ["first", "service"]  # before the two that came first from new addresses
    assert sorted(held.order[2:]) == ["new 1", "new 2"]


def test_a_waiting_login_whose_address_is_refused_meanwhile_is_refused_unchecked(settings):
    settings.SIGNALBOX_LOGIN_CONCURRENCY = 1
    settings.SIGNALBOX_LOGIN_FAILURES = 2
    guard = LoginGuard()
    held = Held("s1", "s2", "s3")  # wrong passwords, each
    order = held.order
    threads = {}
    for n, name in enumerate(("s1", "s2", "s3")):
        threads[name] = _in_thread(lambda name=name: guard.check("10.5.0.1", name.encode(), held(name)))
        _wait_until(lambda n=n: len(order) + guard.waiting["unknown"] == n + 1)
    held.gates["s1"].set()
    _wait_until(lambda: len(order) == 2)  # s2 or s3 (waiters of one kind have no order among them)
    held.release()  # the address's second failure: the one still waiting is refused without its check
    for thread, _ in threads.values():
        thread.join(5)
    assert len(order) == 2
    (last,) = {"s2", "s3"} - set(order)
    assert [threads[name][1] for name in order] == [{"result": None}] * 2
    assert isinstance(threads[last][1]["error"], LoginRefused)
    assert (guard.running, guard.waiting, guard.checks) == (0, {"known": 0, "unknown": 0, "suspect": 0}, {})


def test_logins_with_the_same_credentials_share_one_check(settings):
    settings.SIGNALBOX_LOGIN_CONCURRENCY = 1
    settings.SIGNALBOX_LOGIN_QUEUE = 0  # no room to wait: only sharing the running check lets them in
    guard = LoginGuard()
    release = threading.Event()
    calls: list[int] = []

    def slow():
        calls.append(1)
        release.wait(5)
        return "svc"

    threads = [_in_thread(lambda n=n: guard.check(f"10.0.1.{n}", b"svc:pw", slow)) for n in range(5)]
    _wait_until(lambda: calls == [1])
    time.sleep(0.05)
    release.set()
    for thread, _ in threads:
        thread.join(5)
    assert [outcome for _, outcome in threads] == [{"result": "svc"}] * 5
    assert calls == [1]


def test_a_failing_check_fails_every_login_that_shared_it(settings):
    guard = LoginGuard()
    release = threading.Event()

    def broken():
        release.wait(5)
        raise RuntimeError("database away")

    first, first_outcome = _in_thread(lambda: guard.check("10.0.0.1", b"k", broken))
    _wait_until(lambda: guard.running == 1)
    second, second_outcome = _in_thread(lambda: guard.check("10.0.0.2", b"k", broken))
    time.sleep(0.05)
    release.set()
    first.join(5)
    second.join(5)
    assert isinstance(first_outcome["error"], RuntimeError)
    assert isinstance(second_outcome["error"], RuntimeError)
    assert (guard.running, guard.waiting, guard.checks) == (0, {"known": 0, "unknown": 0, "suspect": 0}, {})


# -- the socket logins, in-process ----------------------------------------------------------------------


@pytest.fixture
def checks(ws_runtime, settings) -> list[str]:
    """The password checks Django's hasher ran from here on (alice's hash is MD5, as the counting one)."""
    return hashers.counted(settings)


async def _connect(login: str, passcode: str):
    async with stomp() as client:
        await client.send("CONNECT", {"accept-version": "1.2", "host": "x", "login": login,
                                      "passcode": passcode})
        return await client.receive()


@pytest.mark.usefixtures("ws_runtime")
async def test_stomp_logins_past_the_failures_get_an_error_naming_the_limit_without_a_check(
        checks, stomp_user, settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 3
    _, token = stomp_user
    for _ in range(3):
        frame = await _connect("alice", "wrong")
        assert frame.get("message") == "User name [alice] or password is invalid."
    refused = await _connect("alice", "secret")
    assert refused.command == "ERROR"
    assert refused.get("message").startswith("Too many failed logins from ")
    assert refused.get("message").endswith("(SIGNALBOX_LOGIN_FAILURES)")
    assert int(refused.get("retry-after")) >= 1
    assert len(checks) == 3  # the refused login ran no hasher
    # An API token needs no hasher, and is not a password guess: it still logs in from that address.
    assert (await _connect("alice", token)).command == "CONNECTED"
    assert (await _connect("", token)).command == "CONNECTED"
    assert len(checks) == 3


@pytest.mark.usefixtures("ws_runtime")
async def test_a_token_given_with_its_login_runs_no_hasher_and_counts_no_failure(checks, stomp_user,
                                                                                 settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 1
    _, token = stomp_user
    for _ in range(3):
        assert (await _connect("alice", token)).command == "CONNECTED"
    assert checks == []
    assert (await _connect("alice", "secret")).command == "CONNECTED"  # no failure was counted


@pytest.mark.usefixtures("ws_runtime", "stomp_user")
async def test_the_json_protocol_answers_a_refused_login_with_login_refused(checks, settings):
    settings.SIGNALBOX_LOGIN_FAILURES = 1
    async with websocket("/ws/v1") as ws:
        await send_json(ws, {"type": "connect", "id": "c", "login": "alice", "passcode": "wrong"})
        assert (await receive_json(ws))["code"] == "authentication_failed"
    async with websocket("/ws/v1") as ws:
        await send_json(ws, {"type": "connect", "id": "c", "login": "alice", "passcode": "secret"})
        answer = await receive_json(ws)
    assert answer["type"] == "error" and answer["code"] == "login_refused"
    assert "(SIGNALBOX_LOGIN_FAILURES)" in answer["message"]
    assert len(checks) == 1


@pytest.mark.usefixtures("ws_runtime", "stomp_user")
async def test_a_failed_login_is_answered_after_the_pause(checks, settings):
    settings.SIGNALBOX_LOGIN_FAILURE_DELAY = 0.4
    started = time.monotonic()
    assert (await _connect("alice", "wrong")).command == "ERROR"
    assert time.monotonic() - started >= 0.4
    settings.SIGNALBOX_LOGIN_FAILURES = 1
    started = time.monotonic()
    refused = await _connect("alice", "secret")
    assert "(SIGNALBOX_LOGIN_FAILURES)" in refused.get("message")
    assert time.monotonic() - started >= 0.4  # a refusal too
    assert len(checks) == 1


# -- a real listener -------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_real_listener_refuses_a_client_address_past_its_failures(gateway_data):
    from tests.helpers.gateway_server import spawn_stomp_listener, wait_listening
    from tests.helpers.stomp_client import RawTcp

    data_dir, namespace = gateway_data
    server = wait_listening(spawn_stomp_listener(data_dir, namespace, "login-guard",
                                                 SIGNALBOX_LOGIN_FAILURES="2"))
    try:
        answers = []
        for passcode in ("wrong", "wrong", "secret"):
            conn = RawTcp(server.port)
            try:
                conn.send_raw(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:alice\npasscode:%s\n\n\x00"
                              % passcode.encode())
                answers.append(conn.expect("ERROR"))
            finally:
                conn.close()
        assert [a.get("message") for a in answers[:2]] == ["User name [alice] or password is invalid."] * 2
        assert answers[2].get("message").startswith("Too many failed logins from 127.0.0.1: 2 in 60 s")
        # another address of this host is another client
        conn = RawTcp(server.port, source="127.0.0.2")
        try:
            conn.send_raw(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:alice\npasscode:secret\n\n\x00")
            assert conn.expect("CONNECTED").command == "CONNECTED"
        finally:
            conn.close()
    finally:
        server.kill()
