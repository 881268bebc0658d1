"""bench/versus_activemq.py's own logic: the STOMP frame reader its clients share, case selection and the
table's medians and ratios. (The bench itself is run by hand: benchmarks are not timed tests.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import versus_activemq as bench  # noqa: E402
from versus_clients import FrameBuffer, Target, encode  # noqa: E402


def frames_of(chunks: list[bytes]) -> list[tuple[str, dict[str, str], bytes]]:
    reader, out = FrameBuffer(), []
    for chunk in chunks:
        reader.feed(chunk)
        while (frame := reader.pop()) is not None:
            out.append(frame)
    return out


REPEATED = b"RECEIPT\nreceipt-id:7\nx:first\nx:second\n\n\x00"
STREAM = (b"\n" + encode("MESSAGE", {"destination": "/queue/a", "content-length": "5"}, b"a\x00b\nc")
          + b"\r\n\n" + REPEATED
          + encode("MESSAGE", {"destination": "/queue/b"}, b"plain"))
EXPECTED = [("MESSAGE", {"destination": "/queue/a", "content-length": "5"}, b"a\x00b\nc"),
            ("RECEIPT", {"receipt-id": "7", "x": "first"}, b""),
            ("MESSAGE", {"destination": "/queue/b"}, b"plain")]


def test_frames_whole_packed_together() -> None:
    """Several frames in one read (Signalbox packs them into one WebSocket message), heart-beat EOLs between
    them skipped, a body with a NUL read by its content-length, the first of a repeated header kept."""
    assert frames_of([STREAM]) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_frames_cut_anywhere(cut: int) -> None:
    assert frames_of([STREAM[:cut], STREAM[cut:]]) == EXPECTED


def test_frames_byte_by_byte() -> None:
    assert frames_of([STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_only_expands_groups_and_names_unknown_ones() -> None:
    assert {case.group for case in bench.select_cases("ws,rest-native")} == {
        "ws-stream", "ws-receipt", "ws-pingpong", "rest-native"}
    assert [case.group for case in bench.select_cases("pingpong")] == ["tcp-pingpong"]  # the old names
    with pytest.raises(SystemExit, match="unknown case group 'websocket'.*ws-stream"):
        bench.select_cases("tcp,websocket")


def signalbox(server: str, fsync: str) -> Target:
    return Target(f"Signalbox, {server}, AOF {fsync}", 1, "admin", "x", rest_native="t", signalbox=True,
                  facts={"server": server, "fsync": fsync})


AMQ = Target("ActiveMQ 5.17.2", 1, "admin", "admin", http_url="http://127.0.0.1:1")
REDIS_E, VALKEY_E = signalbox("Redis 7.0.15", "everysec"), signalbox("Valkey 9.1.2", "everysec")
REDIS_A = signalbox("Redis 7.0.15", "always")


def test_comparisons_pair_valkey_with_redis_of_the_same_fsync_only() -> None:
    pairs = [(title, a.name, b.name) for title, a, b in bench.comparisons([AMQ, REDIS_E, VALKEY_E, REDIS_A])]
    assert pairs == [(f"{t.name} / ActiveMQ", t.name, AMQ.name) for t in (REDIS_E, VALKEY_E, REDIS_A)] + [
        ("Valkey / Redis, AOF everysec", VALKEY_E.name, REDIS_E.name)]
    assert bench.comparisons([REDIS_E, VALKEY_E]) == [("Valkey / Redis, AOF everysec", VALKEY_E, REDIS_E)]


def test_table_medians_ratios_and_activemqs_figure_for_native_cases() -> None:
    results = {
        (bench.REST_POST, "per s"): {AMQ.name: [100, 300, 200], REDIS_E.name: [400, 500, 600]},
        (bench.REST_POST, "p50 ms"): {AMQ.name: [4.0, 4.0, 4.0], REDIS_E.name: [2.0, 1.0, 1.0]},
        ("REST native produce (ActiveMQ: its POST)", "per s"): {REDIS_E.name: [1000, 1000, 1000]},
    }
    lines = bench.table(bench.CASES, [AMQ, REDIS_E], results)
    assert lines[0] == f"| case | figure | {AMQ.name} | {REDIS_E.name} | {REDIS_E.name} / ActiveMQ |"
    assert lines[2] == f"| {bench.REST_POST} | per s | 200.00 | 500.00 | 2.50x |"
    assert lines[3] == f"| {bench.REST_POST} | p50 ms | 4.00 | 1.00 | 4.00x |"  # ActiveMQ's over ours
    assert lines[4] == ("| REST native produce (ActiveMQ: its POST) | per s | 200.00 (its /api/message row) "
                        "| 1,000.00 | 5.00x |")


def test_rounds_alternate_the_order() -> None:
    assert [bench.order([1, 2, 3], r) for r in (1, 2, 3)] == [[1, 2, 3], [3, 2, 1], [1, 2, 3]]


def test_spread_names_the_figure_that_moved_most() -> None:
    results = {("ping-pong", "per s"): {"A": [100, 200, 150], "B": [100, 110]},
               ("stream", "msgs/s"): {"A": [10, 10, 10], "B": [5]}}
    assert bench.spread(results) == ("round-to-round spread (largest round over smallest, per broker and "
                                     "figure): median 1.10x, largest 2.00x (ping-pong per s, A)")
    assert bench.spread({("stream", "msgs/s"): {"A": [10]}}) == "round-to-round spread: one round only"
