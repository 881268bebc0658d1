"""An ended session, in Debian's headless Chromium (issue 26, item 5): logging out in another tab, a session
that expires on the server, a session cookie gone. The page notices within two seconds (the live feed is
closed with 4401, or an API call answers 401), says "Logged out", stops calling the API, and its log-in
prompt returns to the same page, query string included."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from playwright.sync_api import expect

from broker_core.messages import Message
from tests.console.conftest import PASSWORD, login
from tests.helpers.gateway_server import ROOT, server_env

pytestmark = pytest.mark.e2e


def _browse(page, server, queue_name) -> str:
    """Open the queue's browse page with a selector in its URL; returns that URL."""
    page.goto(f"{server.url}/console/queues/{queue_name}/browse/")
    page.fill("#selector", "n > 1")
    page.press("#selector", "Enter")
    expect(page).to_have_url(f"{server.url}/console/queues/{queue_name}/browse/?selector=n+%3E+1")
    expect(page.locator("#live")).to_have_attribute("data-state", "connected")
    return page.url


def _log_in_again(page, server, url) -> None:
    prompt = page.locator("#session-ended")
    page.get_by_role("link", name="Log in again").click()
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(url)
    expect(page.locator("#live")).to_have_attribute("data-state", "connected")
    expect(prompt).to_have_count(0)


def test_logging_out_in_another_tab_shows_the_prompt_within_two_seconds_and_it_returns_to_the_page(
        chromium, console_server, broker, queue_name):
    broker.send(queue_name, [Message(body="a", properties={"n": 2})])
    page = login(chromium, console_server)
    try:
        url = _browse(page, console_server, queue_name)
        other = page.context.new_page()
        other.goto(f"{console_server.url}/console/")
        other.get_by_role("button", name="Log out").click()
        other.wait_for_url(f"{console_server.url}/console/login/")
        logged_out = time.monotonic()
        prompt = page.locator("#session-ended")
        expect(prompt).to_be_visible(timeout=2500)
        assert time.monotonic() - logged_out < 2.5
        expect(prompt).to_contain_text("Your session has ended")
        expect(page.locator("#live")).to_have_attribute("data-state", "signed-out")
        expect(page.locator("#live")).to_contain_text("Logged out")
        page.keyboard.press("Escape")  # the prompt stays: the page behind it no longer updates
        expect(prompt).to_be_visible()
        _log_in_again(page, console_server, url)
        expect(page.locator("#selector")).to_have_value("n > 1")
    finally:
        page.context.close()


def test_a_session_expired_on_the_server_is_noticed_by_the_open_page(chromium, console_server, broker,
                                                                       queue_name):
    broker.send(queue_name, [Message(body="a", properties={"n": 2})])
    page = login(chromium, console_server)
    try:
        url = _browse(page, console_server, queue_name)
        key = next(c["value"] for c in page.context.cookies() if c["name"] == "sessionid")
        expire = ("from django.contrib.sessions.models import Session; from django.utils import timezone; "
                  f"import datetime; n = Session.objects.filter(session_key={key!r}).update("
                  "expire_date=timezone.now() - datetime.timedelta(seconds=1)); assert n == 1")
        env = server_env(console_server.data_dir, console_server.namespace)
        subprocess.run([sys.executable, "manage.py", "shell", "-c", expire], cwd=ROOT, env=env, check=True,
                       timeout=60)
        expired = time.monotonic()
        expect(page.locator("#session-ended")).to_be_visible(timeout=2500)
        assert time.monotonic() - expired < 2.5
        _log_in_again(page, console_server, url)
    finally:
        page.context.close()


def test_a_lost_session_cookie_fails_one_call_then_prompts_and_calls_nothing_more(chromium, console_server,
                                                                                 broker, queue_name):
    broker.send(queue_name, [Message(body="a", properties={"n": 2})])
    page = login(chromium, console_server)
    try:
        url = _browse(page, console_server, queue_name)
        refused: list[str] = []
        page.on("response", lambda r: refused.append(r.url) if r.status in (401, 403) else None)
        page.context.clear_cookies()
        # the open feed's server-side session is still valid: the next API call is what finds out
        page.fill("#selector", "n > 0")
        page.press("#selector", "Enter")
        expect(page.locator("#session-ended")).to_be_visible(timeout=2000)
        expect(page.locator("#live")).to_have_attribute("data-state", "signed-out")
        expect(page.locator("#toast")).to_be_hidden()  # the prompt says it, not a toast of the 401
        calls = page.evaluate("""async () => {
            try { await SB.api("GET", "console/overview"); return "answered"; }
            catch (e) { return e.status; }
        }""")
        assert calls == 401
        time.sleep(2)
        assert len(refused) == 1, refused  # the one call that found out, nothing after it
        _log_in_again(page, console_server, url.replace("n+%3E+1", "n+%3E+0"))
    finally:
        page.context.close()


def test_a_console_json_view_that_redirects_to_the_login_is_an_ended_session(chromium, console_server, broker,
                                                                            queue_name):
    """The analytics summary is a login_required Django view: logged out, it redirects to the login page
    (fetch follows it to an HTML page) instead of answering 401."""
    broker.send(queue_name, [Message(body="a", properties={"n": 2})])
    page = login(chromium, console_server)
    try:
        url = _browse(page, console_server, queue_name)
        page.context.clear_cookies()
        status = page.evaluate("""async (path) => {
            try { await SB.api("GET", path); return "answered"; } catch (e) { return e.status; }
        }""", f"/console/analytics/queue/{queue_name}/summary.json")
        assert status == 401
        expect(page.locator("#session-ended")).to_be_visible()
        _log_in_again(page, console_server, url)
    finally:
        page.context.close()
