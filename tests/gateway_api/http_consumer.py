"""A real HTTP consumer process for the end-to-end test: creates its consumer, long-polls, acks each
message, and writes one line per event to its log (`recv <id> <group> <redelivered> <first>`, then
`ack <id>` once the ack is confirmed). With --hold-after N it stops acking after N acks, receives
once more and waits to be killed, holding those messages unacknowledged."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--selector", default="")
    parser.add_argument("--lease-ms", type=int, default=2000)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--hold-after", type=int, default=0)
    parser.add_argument("--stop-file", type=Path)
    args = parser.parse_args()
    headers = {"Authorization": f"Token {args.token}"}
    log = args.log.open("a", buffering=1)
    with httpx.Client(base_url=args.url, headers=headers, timeout=30) as http:
        created = http.post(f"/api/v1/queues/{args.queue}/consumers",
                            json={"selector": args.selector, "prefetch": 5, "lease_ms": args.lease_ms})
        created.raise_for_status()
        path = f"/api/v1/queues/{args.queue}/consumers/{created.json()['consumer_id']}"
        log.write(f"consumer {created.json()['consumer_id']}\n")
        acked = 0
        while True:
            response = http.post(f"{path}/receive", params={"max_messages": 5, "wait": 1})
            response.raise_for_status()
            messages = response.json()["messages"]
            for m in messages:
                log.write(f"recv {m['message_id']} {m['group_id']} {int(m['redelivered'])} "
                          f"{int(m['group_first_for_consumer'])}\n")
            if args.hold_after and acked >= args.hold_after and messages:
                log.write("holding\n")
                while True:  # never ack, never renew: the lease lapses once we are killed
                    time.sleep(1)
            for m in messages:
                ack = http.post(f"{path}/ack", json={"message_ids": [m["message_id"]]})
                ack.raise_for_status()
                log.write(f"ack {m['message_id']}\n")
                acked += 1
            if not messages and args.stop_file and args.stop_file.exists():
                http.delete(path).raise_for_status()  # a clean exit closes its consumer
                return 0


if __name__ == "__main__":
    sys.exit(main())
