"""AMQ_SCHEDULED_CRON on time through the gateway (STOMP over WebSocket, no maintenance tick here): the
process that took the send dispatches the queue at the job's first time and, from what each dispatch
reports, at every time after it (broker_core/due.py). One test, which waits for the next minute boundary
(it sends 1.5 to 2.5 s before one: up to a minute's wait first)."""

from __future__ import annotations

import time

Q = "/queue/{}"
LATE_MS = 400  # how late a delivery may reach the client (the timers fire within a few ms)


def test_cron_jobs_fire_at_the_minute_and_their_runs_follow_on_time(clients, queue_name):
    client = clients()
    client.receipt(client.conn.subscribe, Q.format(queue_name), id="s")
    while not 57.5 <= time.time() % 60 <= 58.5:
        time.sleep(0.1)
    boundary = (int(time.time()) // 60 + 1) * 60 * 1000
    client.receipt(client.conn.send, Q.format(queue_name), "minute",
                   headers={"AMQ_SCHEDULED_CRON": "* * * * *"})
    # first time: the boundary plus the period; a run of 2 from a period later
    client.receipt(client.conn.send, Q.format(queue_name), "run", headers={
        "AMQ_SCHEDULED_CRON": "* * * * *", "AMQ_SCHEDULED_PERIOD": "1000", "AMQ_SCHEDULED_REPEAT": "1"})
    got = []
    for _ in range(3):
        frame = client.expect("MESSAGE", timeout=8)
        got.append((frame.body, int(time.time() * 1000) - boundary))
    assert [body for body, _ in got] == [b"minute", b"run", b"run"]
    for (_body, late), due in zip(got, (0, 2000, 3000), strict=True):
        assert due <= late <= due + LATE_MS, got
