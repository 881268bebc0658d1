"""Redis key names, built in one place: a destination's key prefix, a topic subscription's, and the
broker-wide keys (registries, transactions, usage, virtual configuration).

A queue script runs on a `Home`: a destination's own keys (`<ns>:{q:orders}`), or one subscription of a
topic (`<ns>:{t:prices}:s:<key>`, inside the topic's hash tag: docs/broker_core.md "Topics"). A home is
not a destination: the operations resolve a topic consumer's home once (its subscription key) and run the
queue scripts on it; the destination it belongs to stays `home.destination`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .destinations import Destination


@dataclass(frozen=True)
class Home:
    """Where a queue script runs: `destination`'s own keys, or (with `key`) one of its subscriptions."""

    destination: Destination
    key: str = ""  # a topic subscription's key (topics.durable_key / non_durable_key); "" the destination's

    @property
    def uri(self) -> str:
        return self.destination.uri

    @property
    def fans_out(self) -> bool:
        """A topic's own keys: its messages are run by its subscriptions' homes, not here."""
        return self.destination.is_topic and not self.key

    @property
    def label(self) -> str:
        """How logs and reports name it: the uri, with `#<key>` for a subscription."""
        return f"{self.uri}#{self.key}" if self.key else self.uri


def prefix(namespace: str, dest: Destination) -> str:
    """A destination's key prefix: its keys share one hash tag, so a Redis Cluster keeps them on one slot."""
    return f"{namespace}:{{{dest.tag}}}"


def home_prefix(namespace: str, home: Home) -> str:
    """A home's key prefix: a subscription's keys are inside its topic's hash tag."""
    base = prefix(namespace, home.destination)
    return f"{base}:s:{home.key}" if home.key else base


def registry_key(namespace: str) -> str:
    """<ns>:destinations: destination uri -> creation time."""
    return f"{namespace}:destinations"


def durables_key(namespace: str) -> str:
    """<ns>:durables: `client id \\0 subscription name` -> the topic uri it is on (a durable key is
    broker-wide: subscribing to another topic under the same key replaces the subscription)."""
    return f"{namespace}:durables"


def wildcards_key(namespace: str) -> str:
    """<ns>:wildcards: the topic patterns that have subscriptions (scripts/lua/includes/wildcard.lua)."""
    return f"{namespace}:wildcards"


def tx_key(namespace: str, tx: str) -> str:
    """<ns>:tx:<id>: a transaction's buffered sends and acks."""
    return f"{namespace}:tx:{tx}"


def usage_key(namespace: str) -> str:
    """The broker-wide usage hash the scripts keep (includes/flow.lua)."""
    return f"{namespace}:usage"


def virtual_config_key(namespace: str) -> str:
    """<ns>:virtual: the virtual destination configuration (JSON), with `:version`."""
    return f"{namespace}:virtual"


def due_key(namespace: str) -> str:
    """<ns>:due: the maintenance index (broker_core/maintenance.py); `:periodic`, `:state` beside it."""
    return f"{namespace}:due"


def deletions_key(namespace: str) -> str:
    """<ns>:deleting: the destinations whose deletion is under way (uri -> when it was started, or taken
    over by maintenance), and `:tally` beside it (uri -> the tally key the deletion counts in, when it has
    one). Written before the deletion's first step, removed by its last (destination_delete.lua), so a
    deletion whose driver died is found and finished by maintenance (Router.finish_deletions)."""
    return f"{namespace}:deleting"


def temp_tally_key(namespace: str) -> str:
    """<ns>:temps:deleted: temporary destinations deleted because their connection ended, and their
    messages (`destinations`, `messages`), counted in the deletion's own script call."""
    return f"{namespace}:temps:deleted"
