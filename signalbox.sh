#!/usr/bin/env bash
# Set-up and entry point: creates .venv on first use, installs the project with its test extra
# (again whenever pyproject.toml changes), then hands over to the launcher.
#   ./signalbox.sh run    # embedded Redis + migrations + admin user + web server, STOMP listener, worker, beat
#   ./signalbox.sh test   # ruff, the import contracts, then the whole pytest suite; extra arguments go to pytest
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PYTHON="${PYTHON:-python3.11}"
VENV="${SIGNALBOX_VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        if command -v python3 >/dev/null 2>&1 && python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            PYTHON=python3
        else
            echo "signalbox: error: $PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
            exit 2
        fi
    fi
    echo "signalbox: creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.signalbox-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "signalbox: installing the project and its test tools into $VENV"
    "$VENV/bin/python" -m pip install --quiet -e '.[test]'
    touch "$stamp"
fi

# Browser-side packages (package.json; node_modules/ is never committed): uPlot draws the console's charts
# (`run`), @stomp/stompjs is for a browser test (`test`). Without npm, or when it fails (offline), the
# system still runs: the console's charts then say that uPlot is missing and show the figures as text.
npm_stamp="node_modules/.signalbox-installed"
if { [ "${1:-}" = "test" ] || [ "${1:-}" = "run" ]; } && [ -f package-lock.json ] \
        && { [ ! -f "$npm_stamp" ] || [ package-lock.json -nt "$npm_stamp" ]; }; then
    if command -v npm >/dev/null 2>&1; then
        echo "signalbox: installing the npm packages (the console's charts, the browser tests)"
        if npm ci --no-audit --no-fund --loglevel=error; then
            touch "$npm_stamp"
        elif [ "${1:-}" = "test" ]; then
            echo "signalbox: error: npm ci failed; the browser tests need its packages" >&2
            exit 1
        else
            echo "signalbox: npm ci failed; the console's charts show figures as text until it succeeds" >&2
        fi
    else
        echo "signalbox: npm not found; the console's charts show figures as text and the browser tests" \
             "will be skipped (install npm and run this again)" >&2
    fi
fi

exec "$VENV/bin/python" -m signalbox.launcher "$@"
