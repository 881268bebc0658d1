"""Where the command line finds the server and its token: flags, then the environment, then a TOML file.

    url   --url     SIGNALBOX_URL     url = "..."     default http://127.0.0.1:8000
    token --token   SIGNALBOX_TOKEN   token = "..."   default none (the server answers 401)
    file  --config  SIGNALBOX_CONFIG                  default $XDG_CONFIG_HOME/signalbox/cli.toml
                                                      (~/.config/signalbox/cli.toml)
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from signalbox.cli.errors import USAGE, Failure

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 30.0
FILE_KEYS = {"url": str, "token": str, "timeout": (int, float)}


@dataclass(frozen=True)
class Settings:
    url: str
    token: str | None
    timeout: float
    source: dict[str, str]  # each setting's origin (flag, environment, file path, default), for errors


def default_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "signalbox" / "cli.toml"


def read_file(path: Path, explicit: bool) -> dict[str, Any]:
    """The file's settings; {} when the default file does not exist. A file named by --config or
    SIGNALBOX_CONFIG must exist. Unknown keys and wrong types are refused by name."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        if explicit:
            raise Failure(f"config file {path} does not exist", USAGE) from None
        return {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise Failure(f"config file {path}: {e}", USAGE) from None
    for key, value in data.items():
        if key not in FILE_KEYS:
            raise Failure(f"config file {path}: unknown key {key!r} (known: {', '.join(FILE_KEYS)})", USAGE)
        if isinstance(value, bool) or not isinstance(value, FILE_KEYS[key]):
            raise Failure(f"config file {path}: {key} has the wrong type ({type(value).__name__})", USAGE)
    return data


def resolve(url: str | None, token: str | None, config: str | None, timeout: float | None) -> Settings:
    """Flags override the environment, which overrides the file."""
    env = os.environ
    if config is not None and not config.strip():  # (else the default file would be read instead)
        raise Failure("--config is empty", USAGE)
    named = config or env.get("SIGNALBOX_CONFIG")
    path = Path(named).expanduser() if named else default_path()
    data = read_file(path, explicit=bool(named))
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    for key, flag, variable, default in (("url", url, "SIGNALBOX_URL", DEFAULT_URL),
                                         ("token", token, "SIGNALBOX_TOKEN", None),
                                         ("timeout", timeout, "SIGNALBOX_TIMEOUT", DEFAULT_TIMEOUT)):
        if flag is not None:
            if not str(flag).strip():  # (`--token "$TOKEN"` with TOKEN unset: not "no token, give --token")
                raise Failure(f"--{key} is empty", USAGE)
            values[key], source[key] = flag, f"--{key}"
        elif env.get(variable):
            values[key], source[key] = env[variable], variable
        elif key in data:
            values[key], source[key] = data[key], str(path)
        else:
            values[key], source[key] = default, "default"
    try:
        values["timeout"] = float(values["timeout"])
    except ValueError:
        raise Failure(f"timeout from {source['timeout']} is not a number: {values['timeout']!r}",
                      USAGE) from None
    if not 0 < values["timeout"] < math.inf:  # (nan too: the HTTP client would end in a traceback)
        raise Failure(f"timeout from {source['timeout']} must be a number above 0, got {values['timeout']}",
                      USAGE)
    # Read from a file a URL or token keeps its line end, pasted it may gain a space: neither has
    # whitespace of its own, and in a header or URL it is refused by the HTTP client (as an unreachable
    # server, or with a traceback).
    url_text = str(values["url"]).strip().rstrip("/")
    if not url_text.startswith(("http://", "https://")):
        raise Failure(f"url from {source['url']} must start with http:// or https://, got {url_text!r}",
                      USAGE)
    if not url_text.isprintable():
        raise Failure(f"url from {source['url']} has a character that is not printable: {url_text!r}", USAGE)
    token_text = (values["token"] or "").strip()
    if not (token_text.isascii() and token_text.isprintable()) or " " in token_text:
        raise Failure(f"token from {source['token']} is not a token: it has a space or a character that is "
                      "not printable ASCII", USAGE)
    return Settings(url_text, token_text or None, values["timeout"], source)
