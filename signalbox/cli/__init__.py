"""`signalbox`, the command line: an adapter over the REST API (docs/cli.md). It imports neither Django
nor broker_core, so it starts fast and runs where only the package is installed."""

from signalbox.cli.main import app

__all__ = ["app"]
