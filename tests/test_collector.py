"""signalbox/collector.py: a server process's start-up objects leave the cyclic collector's sight."""

import subprocess
import sys

from signalbox.collector import YOUNG_THRESHOLD


def test_settle_collects_then_freezes_and_raises_the_young_threshold():
    # in a process of its own: the test process's collector is left as it is
    code = (
        "import gc, weakref, signalbox.collector as c\n"
        "class Node: pass\n"
        "before = gc.get_threshold()\n"
        "gc.disable()\n"  # (no collection but settle's own)
        "left = Node(); left.me = left; gone = weakref.ref(left); del left\n"  # a cycle start-up left
        "c.settle()\n"
        "print(gone() is None, gc.get_freeze_count() > 0, gc.get_threshold()[0],"
        " gc.get_threshold()[1:] == before[1:])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # the cycle was collected before the freeze (frozen, it would never be); the young generation's
    # threshold raised, the older ones' kept
    assert out.split() == ["True", "True", str(YOUNG_THRESHOLD), "True"]
