"""Redis URLs for tests that need another database of the session's server."""

from __future__ import annotations

import urllib.parse


def with_database(url: str, db: int) -> str:
    """The same server's URL with database `db`: redis://host:port/N, or unix://PATH?db=N (the embedded
    server's socket, signalbox/embedded_redis.py)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        query = dict(urllib.parse.parse_qsl(parts.query), db=str(db))
        return f"unix://{parts.netloc}{parts.path}?{urllib.parse.urlencode(query)}"
    return urllib.parse.urlunsplit(parts._replace(path=f"/{db}"))
