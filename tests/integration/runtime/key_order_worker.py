"""A key-ordered app's main consumer (`"role": "main"`, the default) or its tier consumers (`"role": "tiers"`) in a
process of its own, for the SIGKILL tests of key order: `python key_order_worker.py '<json settings>'`.

Values are `"<key>:<seq>"`; the handler fails on attempts up to `failures(key, seq)` (by the record's attempt, so a
repeated call after a crash fails or succeeds as the first did). Every call and DLQ write is appended to a
JSON-lines ledger shared with the test process (line-buffered appends: the file's order is the order of the
calls across both processes; each entry names the app's `member`, if the settings give one). `kill_after` followers
handed off (by the main consumer, or forwarded by a tier's), the process SIGKILLs itself: a follower hop is then
in flight, its key-state record not written, its offset not committed (with `"exactly_once": true`: its
transaction open; `"instance"` names the process, so that a restarted one's producer fences it). With
`"kill_after": null` it never kills itself (the soak test kills it from outside at random moments). With
`"kill_delay_s"` it waits that long first, so that what the open transaction holds reaches the broker (an
exactly-once kill point inside a transaction whose records other readers then wait behind); with `"armed_by"`
(a path) it counts only the followers handed off once that file exists.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retrytopics import Event, KafkaConfig, KeyOrdering, Record, RetryApp, RetryPolicy


def failures(key: int, seq: int) -> int:
    """Handler failures of record `seq` of key `key` before it succeeds (99: exhausted, dead-lettered)."""
    return [0, 1 if seq % 2 == 0 else 0, 2 if seq == 1 else 0, 99 if seq == 2 else 0][key % 4]


class KillAfter:
    """SIGKILLs this process once `count` followers were handed off (or, should none be, three times as many
    failures were: a run without key order is killed too, and its ledger shows the order lost)."""

    def __init__(self, count: int, *, delay_s: float = 0.0, armed_by: str | None = None) -> None:
        self.left = {Event.KEY_ORDER_FOLLOWED: count, Event.RETRY_SCHEDULED: 3 * count}
        self.delay_s = delay_s
        self.armed_by = None if armed_by is None else Path(armed_by)

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event in self.left and (self.armed_by is None or self.armed_by.exists()):
            self.left[event] -= 1
            if self.left[event] <= 0:
                time.sleep(self.delay_s)  # in the loop's thread: its transaction stays open meanwhile
                os.kill(os.getpid(), signal.SIGKILL)


def build_app(settings: dict[str, Any], *, hooks: tuple[Any, ...] = (), clients: Any = None) -> RetryApp:
    """The scenario's app, writing to the shared ledger (the test builds the same one in its process)."""
    ledger = open(settings["ledger"], "a", buffering=1)
    lock = threading.Lock()

    def write(entry: dict[str, Any]) -> None:
        entry["member"] = settings.get("member")
        with lock:
            ledger.write(json.dumps(entry) + "\n")

    def dead_lettered(record: Record[bytes], route: Any) -> None:
        key, seq = (int(part) for part in record.value.decode().split(":"))
        write({"what": "dlq", "key": key, "seq": seq, "reason": str(route.reason)})

    app = RetryApp(
        kafka=KafkaConfig(bootstrap=settings["bootstrap"]),
        group=settings["group"],
        consumer_overrides=settings["consumer"],
        hooks=hooks,
        on_dead_letter=dead_lettered,
        exactly_once=settings.get("exactly_once", False),
        instance_id=settings.get("instance"),  # exactly-once: a restart's producer fences the killed one's
        clients=clients,
    )

    @app.handler(
        settings["source"],
        policy=RetryPolicy(delays=["300ms", "600ms"], max_retries=3),
        ordering=KeyOrdering() if settings.get("ordered", True) else None,
    )
    def handle(record: Record[bytes]) -> None:
        key, seq = (int(part) for part in record.value.decode().split(":"))
        failed = record.attempt <= failures(key, seq)
        write({"what": "fail" if failed else "ok", "key": key, "seq": seq, "pid": os.getpid()})
        if failed:
            raise RuntimeError(f"key {key} record {seq} fails on attempt {record.attempt}")

    return app


if __name__ == "__main__":
    options = json.loads(sys.argv[1])
    after = options.get("kill_after")  # None: killed from outside only (the soak test)
    kills = (
        ()
        if after is None
        else (KillAfter(after, delay_s=options.get("kill_delay_s", 0.0), armed_by=options.get("armed_by")),)
    )
    app = build_app(options, hooks=kills)
    if options.get("role", "main") == "tiers":
        app.run_tiers()
    else:
        app.run()
