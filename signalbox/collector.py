"""The cyclic garbage collector of a long-running server process (the web server, the STOMP listener).

CPython runs a young-generation pass every 700 net allocations of container objects and, every tenth
of those, a pass over the next generation; now and then a full pass walks every object the process
tracks. Once Django, DRF, Channels and the broker are imported, a process holds some hundreds of
thousands of objects that live as long as it does, and a STOMP stream allocates enough per message to
start a pass every few dozen messages: measured in the listener, 180 ms of collections over a
50,000-message stream, about 3.6 µs of the 20 µs of CPU a message costs it (docs/benchmarks.md,
"Session 20").

So once a process has started, `settle()` collects what start-up left, moves the survivors out of the
collector's sight (`gc.freeze`: they are never freed anyway), and lets the young generation grow to
YOUNG_THRESHOLD net allocations before a pass. A message's objects mostly die by reference counting
before that, so a pass comes when cyclic garbage may have built up rather than every few messages;
the same stream then spent 1.3 ms in one collection.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Call once, when the process has imported and set up what it serves with."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
