"""What a script call costs Redis before it does any work, counted by callgrind (exact whatever the load):
the floor under every one-message send and ack (docs/benchmarks.md, "Session 26").

Loads the scripts' includes (scripts/library.py, the same text as the function library) with a few
functions of its own beside them, and counts the instructions per call of: a PING and an HGET sent
directly; EVAL and EVALSHA of `return 1`; an FCALL that returns 1; FCALLs that run one command (HGET;
HSET, propagated to the AOF; XLEN); an FCALL that runs only `base.begin_call` and `base.end_call`, what every
script call runs around its body; and that with the policy read (`base.policy`), which nearly every
script does. Counters are zeroed before each case and read after it (`callgrind_control`), as in
bench/redis_instructions.py.

Usage: VALGRIND_OPTS="--toggle-collect=processCommand" SIGNALBOX_REDIS_SERVER=/usr/bin/redis-server \\
           python bench/script_floor.py [--calls 300]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_instructions import callgrind_server, instructions  # noqa: E402
from broker_core.scripts.library import library  # noqa: E402
from signalbox.embedded_redis import configured_executable  # noqa: E402

FUNCTIONS = """
redis.register_function('floor_one', function(KEYS, ARGV) return 1 end)
redis.register_function('floor_hget', function(KEYS, ARGV) return redis.call('HGET', KEYS[1], 'x') end)
redis.register_function('floor_hset', function(KEYS, ARGV) return redis.call('HSET', KEYS[1], 'x', '1') end)
redis.register_function('floor_xlen', function(KEYS, ARGV) return redis.call('XLEN', KEYS[1]) end)
redis.register_function('floor_begin_end', function(KEYS, ARGV)
  local skipped = base.begin_call(KEYS)
  if skipped then return skipped end
  base.NOW = tonumber(ARGV[1])
  return base.end_call(1)
end)
redis.register_function('floor_begin_policy_end', function(KEYS, ARGV)
  local skipped = base.begin_call(KEYS)
  if skipped then return skipped end
  base.NOW = tonumber(ARGV[1])
  base.policy()
  return base.end_call(1)
end)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    _folder, out_prefix, server, client = callgrind_server("--appendonly", "yes", "--appendfsync", "everysec")
    try:
        # the includes as the library has them (its text up to the first script body), named apart
        lib = library()
        shared = lib.source.split("\ndo\nlocal body", 1)[0].replace(lib.name, "signalbox_floor")
        client.function_load(shared + FUNCTIONS, replace=True)
        client.hset("floor:{q:x}:policy", "maxPageSize", "200")
        client.xadd("floor:{q:x}:events", {"a": 1})
        sha = client.script_load("return 1")
        now = str(int(time.time() * 1000))
        cases = [
            ("PING", lambda: client.ping()),
            ("HGET (a command on its own)", lambda: client.hget("floor:{q:x}:policy", "x")),
            ("EVAL 'return 1'", lambda: client.eval("return 1", 0)),
            ("EVALSHA 'return 1'", lambda: client.evalsha(sha, 0)),
            ("FCALL: return 1", lambda: client.fcall("floor_one", 1, "floor:{q:x}")),
            ("FCALL: one HGET", lambda: client.fcall("floor_hget", 1, "floor:{q:x}:policy")),
            ("FCALL: one HSET (AOF)", lambda: client.fcall("floor_hset", 1, "floor:{q:x}:h")),
            ("FCALL: one XLEN", lambda: client.fcall("floor_xlen", 1, "floor:{q:x}:events")),
            ("FCALL: begin_call, end_call", lambda: client.fcall("floor_begin_end", 1, "floor:{q:x}", now)),
            ("FCALL: begin_call, policy, end_call",
             lambda: client.fcall("floor_begin_policy_end", 1, "floor:{q:x}", now)),
        ]
        print(f"Redis {client.info('server')['redis_version']} ({configured_executable()}) under callgrind, "
              f"AOF everysec, {args.calls} calls per case")
        for name, call in cases:
            for _ in range(20):  # warm-up
                call()
            subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
            for _ in range(args.calls):
                call()
            per_call = instructions(server.pid, out_prefix) / args.calls
            print(f"{name:<38} {per_call / 1000:8.1f} k instructions")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
