"""Issue #22's rule: the adapters (gateway, console, signalbox, analytics) call broker_core's facade
(broker_core/broker.py, and the small modules it exposes) and never reach into how the broker stores its
state. Checked on the source: no adapter module touches a broker's Redis client, its operations, its
driver or connections, or anything private of it; and no adapter module reads a `.redis` attribute at all
except the few listed below, each a client of the adapter's own (not a broker's) or a field of that name.
lint-imports' "adapters call broker_core's facade" contract (pyproject.toml) keeps the imports out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ("gateway", "console", "signalbox", "analytics")
# What a broker has that only broker_core may use: its redis-py client, its operations (key names,
# scripts), the driver loop and its connections. Private names (`_run`, `_perform`...) too.
BROKER_INSIDES = frozenset({"redis", "ops", "driver", "link"})

# `.redis` outside a broker, each with why it is no broker's client. Keyed by file and expression.
ALLOWED_REDIS = {
    # the demo deployment's own redis-py client: it makes its Broker from it, and on a shared Redis
    # removes the demo's throwaway namespace when the demo ends
    ("console/demo.py", "self.redis"),
    # the demo deployment's client, handed to the Broker the screenshot traffic runs on
    ("console/screenshots.py", "system.redis"),
    # Snapshot.redis: what Redis says of itself (INFO), a field of the scrape, not a client
    ("signalbox/metrics.py", "out.redis"),
    ("signalbox/metrics.py", "self.snapshot.redis"),
}


def _modules() -> list[Path]:
    return sorted(p for package in ADAPTERS for p in (ROOT / package).rglob("*.py")
                  if "migrations" not in p.parts)


def _is_broker(node: ast.expr) -> bool:
    """An expression that names a broker: `broker`, `self.broker`, `runtime.async_broker()`, ..."""
    if isinstance(node, ast.Name):
        return "broker" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "broker" in node.attr.lower()
    if isinstance(node, ast.Call):
        return _is_broker(node.func)
    return False


def _attributes() -> list[tuple[str, int, ast.Attribute]]:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute):
                found.append((path.relative_to(ROOT).as_posix(), node.lineno, node))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_adapter_reaches_into_a_broker():
    wrong = [f"{path}:{line}: {ast.unparse(node)}" for path, line, node in _attributes()
             if _is_broker(node.value) and (node.attr in BROKER_INSIDES or _private(node.attr))]
    assert wrong == [], ("adapters call the facade's methods (broker_core/broker.py), not these:\n"
                         + "\n".join(wrong))


def test_no_adapter_reads_a_redis_attribute_but_the_listed_ones():
    seen = {(path, ast.unparse(node.value) + ".redis")
            for path, _, node in _attributes() if node.attr == "redis"}
    unexpected = sorted(seen - ALLOWED_REDIS)
    assert unexpected == [], ("a `.redis` attribute in an adapter: broker state goes through the facade; "
                              f"name a client of the adapter's own otherwise, or list it here: {unexpected}")
    gone = sorted(ALLOWED_REDIS - seen)
    assert gone == [], f"listed but gone (remove them from ALLOWED_REDIS): {gone}"


def test_the_check_sees_a_broker_in_its_usual_spellings():
    """The rule's own test: the spellings the adapters use for a broker are recognised."""
    for text in ("broker.redis", "self.broker.ops", "runtime.async_broker().redis", "broker()._run",
                 "self.hot.broker.link"):
        node = ast.parse(text, mode="eval").body
        assert isinstance(node, ast.Attribute) and _is_broker(node.value), text
    assert not _is_broker(ast.parse("self.session", mode="eval").body)
