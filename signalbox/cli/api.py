"""The REST API as the command line calls it: one client, errors turned into one line and an exit code,
destination arguments turned into paths. No broker semantics here: the server decides everything."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import click

from signalbox.cli.config import Settings
from signalbox.cli.errors import UNREACHABLE, USAGE, Failure

if TYPE_CHECKING:
    import httpx

SCHEMES = {"queue://": "queues", "topic://": "topics"}


def destination_path(text: str) -> str:
    """`orders` or `queue://orders` -> /api/v1/queues/orders; `topic://prices` -> /api/v1/topics/prices.
    The name itself is checked by the server."""
    if "," in text:  # (never in a name: the server's refusal would name its own function)
        raise Failure(f"destination {text!r}: a composite destination (A,B) is for send only; give one "
                      "destination", USAGE)
    kind, name = "queues", text
    for scheme, plural in SCHEMES.items():
        if text.startswith(scheme):
            kind, name = plural, text[len(scheme):]
            break
    else:
        if "://" in text:
            raise Failure(f"destination {text!r}: the scheme is queue:// or topic:// (none means a queue)",
                          USAGE)
    if not name:
        raise Failure(f"destination {text!r} has no name", USAGE)
    try:
        return f"/api/v1/{kind}/{quote(name, safe='')}"
    except UnicodeEncodeError:
        raise Failure(f"destination {text!r} is not UTF-8 text", USAGE) from None


def qualified(text: str) -> str:
    """`orders` -> `queue://orders`: the full form every command's output names a destination by, whatever
    form it was given in."""
    return text if "://" in text else f"queue://{text}"


def problem_message(response: httpx.Response, token_from: str | None) -> tuple[str, dict[str, Any] | None]:
    """One line from an error answer: the problem's title, status, code and detail (RFC 9457). A 401
    says where the token came from (`token_from`: a flag, variable or file; None: no token)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    status = response.status_code
    if not isinstance(body, dict) or not (body.get("title") or body.get("detail")):
        return f"HTTP {status} {response.reason_phrase} from {response.request.url}", None
    title = body.get("title") or response.reason_phrase
    code = body.get("code")
    message = f"{title} ({status}{' ' + code if code else ''})"
    if body.get("detail") and body["detail"] != title:
        message += f": {body['detail']}"
    if status == 401 and token_from is None:
        message += " (no token: give --token, SIGNALBOX_TOKEN or token in the config file)"
    elif status == 401:  # (the three places are read in turn: a stale one may hide the one meant)
        message += f" (the token from {token_from})"
    retry_after = response.headers.get("Retry-After")
    if retry_after:
        message += f" (retry after {retry_after} s)"
    return message, body


T = TypeVar("T")


def waiting_out_outages(call: Callable[[], T], outage: list[bool]) -> T:
    """`call()`, again every Retry-After seconds while the server says the broker is away for a moment (503
    broker_unavailable: Redis restarting, as `run` restarts it after a crash), saying so once per outage on
    stderr (`outage[0]` remembers it was said). For the commands that run until Ctrl-C (`receive --follow`,
    `stat --watch`): broker state lives in Redis and is there again with it. A server that does not answer
    at all still ends the command (exit 3), as any other error does."""
    while True:
        try:
            answer = call()
        except Failure as e:
            if (e.problem or {}).get("code") != "broker_unavailable":
                raise
            if not outage[0]:
                outage[0] = True
                Failure(f"{e.message}; waiting for it (Ctrl-C to stop)").show()
            time.sleep(float((e.problem or {}).get("retry_after") or 1))
            continue
        outage[0] = False
        return answer


class Api:
    def __init__(self, settings: Settings) -> None:
        import httpx  # here: `--help` and usage errors need no HTTP client (half the start-up)

        self.settings = settings
        headers = {"Accept": "application/json", "User-Agent": "signalbox-cli"}
        if settings.token:
            headers["Authorization"] = f"Token {settings.token}"
        try:
            self.http = httpx.Client(base_url=settings.url, headers=headers, timeout=settings.timeout)
        except httpx.InvalidURL as e:
            raise Failure(f"url from {settings.source['url']} is not a URL: {e}", USAGE) from None

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None,
             timeout: float | None = None) -> Any:
        """The answer's JSON (None for an empty answer); raises Failure on any error."""
        import httpx

        url = self.settings.url
        wait = timeout or self.settings.timeout
        try:
            response = self.http.request(method, path, params=params, json=json, timeout=wait)
        except UnicodeEncodeError as e:  # an argument's bytes that are not UTF-8 (Python keeps them as such)
            bad = ascii(e.object[e.start:e.end])
            raise Failure(f"an argument is not UTF-8 text ({bad})", USAGE) from None
        except httpx.TimeoutException:
            raise Failure(f"no answer from Signalbox at {url} within {wait:g} s", UNREACHABLE) from None
        except httpx.TransportError as e:
            raise Failure(f"cannot reach Signalbox at {url}: {e or type(e).__name__}", UNREACHABLE) from None
        if response.status_code >= 400:
            token_from = self.settings.source["token"] if self.settings.token else None
            message, body = problem_message(response, token_from)
            raise Failure(message, problem=body)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise Failure(f"{method} {path}: the answer is not JSON (is {url} a Signalbox server?)") from None

    def pages(self, path: str, params: dict[str, Any] | None = None, rows: str = "results"
              ) -> Iterator[dict[str, Any]]:
        """Every row of a list in the API's paged shapes: limit/offset (`{"results", "next"}`, following
        the `next` link) or cursor (`{<rows>, "next_cursor"}`: groups come as `groups`); a plain list is
        one page."""
        import httpx

        answer = self.call("GET", path, params=params)
        while True:
            if isinstance(answer, list):
                yield from answer
                return
            yield from answer.get(rows, [])
            if answer.get("next"):
                # The link's query only, asked of our own URL: the server writes the link with the scheme
                # and host it saw, which behind a proxy (one terminating TLS, say) are not ours, and the
                # token goes nowhere but to the configured server.
                answer = self.call("GET", path, params=dict(httpx.URL(answer["next"]).params))
            elif answer.get("next_cursor"):
                answer = self.call("GET", path, params={**(params or {}), "cursor": answer["next_cursor"]})
            else:
                return


class Session:
    """The group's --url/--token/--config/--timeout, resolved on first use (so `--help` works whatever
    the config file holds) into one client for the whole command."""

    def __init__(self, url: str | None, token: str | None, config: str | None, timeout: float | None):
        self.options = (url, token, config, timeout)
        self._api: Api | None = None

    def api(self) -> Api:
        if self._api is None:
            from signalbox.cli.config import resolve

            self._api = Api(resolve(*self.options))
            click.get_current_context().call_on_close(self._api.close)
        return self._api


def api() -> Api:
    """The current command's client."""
    return click.get_current_context().find_object(Session).api()
