"""The broker-wide settings (ActiveMQ's <systemUsage>): the `[systemUsage]` table of the configuration
file. How producers are held to them is in broker_core/flow.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_core.errors import InvalidPolicy

from .files import read_config_table

DEFAULT_MEMORY_LIMIT = 1 << 30  # SystemUsage's memory limit: 1 GB (the scripts use the same default)


@dataclass(frozen=True)
class SystemUsage:
    """The broker-wide settings (ActiveMQ's <systemUsage>): the memory limit over every destination's
    stored bytes, and the defaults a policy that leaves them unset inherits."""

    memory_limit: int = DEFAULT_MEMORY_LIMIT
    send_fail_if_no_space: bool = False
    send_fail_if_no_space_after_timeout: int = 0

    _NAMES = {"memoryLimit": "memory_limit", "sendFailIfNoSpace": "send_fail_if_no_space",
              "sendFailIfNoSpaceAfterTimeout": "send_fail_if_no_space_after_timeout"}

    def __post_init__(self) -> None:
        limit = self.memory_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidPolicy(f"systemUsage memoryLimit must be a number of bytes >= 0 (0 = no limit), "
                                f"got {limit!r}", key="memoryLimit")
        if not isinstance(self.send_fail_if_no_space, bool):
            raise InvalidPolicy(f"systemUsage sendFailIfNoSpace must be true or false, got "
                                f"{self.send_fail_if_no_space!r}", key="sendFailIfNoSpace")
        timeout = self.send_fail_if_no_space_after_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
            raise InvalidPolicy(f"systemUsage sendFailIfNoSpaceAfterTimeout must be milliseconds >= 0, got "
                                f"{timeout!r}", key="sendFailIfNoSpaceAfterTimeout")

    @classmethod
    def from_config(cls, data: Mapping[str, Any], *, source: str = "systemUsage") -> SystemUsage:
        """From the `[systemUsage]` table of the configuration file (camelCase names)."""
        if not isinstance(data, Mapping):
            raise InvalidPolicy(f"{source} must be a table")
        unknown = sorted(set(data) - set(cls._NAMES))
        if unknown:
            raise InvalidPolicy(f"{source}: unknown setting {unknown[0]!r} (expected one of "
                                f"{', '.join(cls._NAMES)})", key=unknown[0])
        return cls(**{cls._NAMES[k]: v for k, v in data.items()})


def load_system_usage(path: str | Path) -> SystemUsage:
    """The `[systemUsage]` table of a TOML configuration file (defaults when there is none)."""
    return read_config_table(path, "systemUsage", SystemUsage.from_config)
