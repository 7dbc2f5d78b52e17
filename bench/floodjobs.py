"""The retry-flood scenario's child (bench/scenarios/flood.py): ``python -m bench.floodjobs app_flood '<json>'``.

A `RetryApp` whose handler's dependency is down from `down_from_s` to `down_until_s` after the first record is
produced, while `n` records arrive at `rate` a second; with or without a `FloodGuard`. Reports the calls made
while the dependency was down, the dead letters (every record is good: each one is a record the outage cost),
the handled ids, and how long after the recovery every record produced before it had settled (handled or
dead-lettered): the time to catch up with the outage's backlog, records still arriving after it aside.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Producer

from bench.child import run_role
from bench.measure import emit
from retrytopics import FloodGuard, KafkaConfig, Record, RetryApp, RetryPolicy
from retrytopics.observe.events import Event

#: the guard the scenario runs (docs/flood-guard.md): the defaults but a window of 2 s (the successes before
#: the outage leave it sooner, so it opens after fewer failed calls) and a ramp of 2 s (the outage's backlog is
#: called within seconds once a probe succeeded)
GUARD = FloodGuard(window="2s", backoff="1s", max_backoff="4s", ramp="2s", ramp_start=50.0)


class _Tally:
    """What the handler and the hooks saw, from every consumer thread."""

    wanted_events = frozenset({Event.DLQ_DISPATCHED, Event.FLOOD_GUARD_OPENED, Event.FLOOD_GUARD_PROBED})

    def __init__(self, n: int) -> None:
        self.lock = threading.Lock()
        self.n = n
        self.ok: set[int] = set()
        self.calls_down = 0
        self.calls = 0
        self.dead = 0
        self.openings = 0
        self.probes = 0
        self.t0: float | None = None
        self.down = (0.0, 0.0)
        self.done_at: float | None = None
        self.done = threading.Event()
        #: the ids produced before the recovery (the outage's backlog), and when the last of them settled
        self.backlog: set[int] = set()
        self.backlog_at: float | None = None

    def is_down(self, now: float) -> bool:
        return self.t0 is not None and self.down[0] <= now - self.t0 < self.down[1]

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        with self.lock:
            if event is Event.DLQ_DISPATCHED:
                self.dead += 1
                self._check()
            elif event is Event.FLOOD_GUARD_OPENED:
                self.openings += 1
            else:
                self.probes += 1

    def handled(self, i: int) -> None:
        with self.lock:
            self.ok.add(i)
            self._settled(i)
            self._check()

    def dead_lettered(self, i: int) -> None:
        with self.lock:
            self._settled(i)

    def _settled(self, i: int) -> None:
        self.backlog.discard(i)
        if not self.backlog and self.backlog_at is None:
            self.backlog_at = time.monotonic()

    def _check(self) -> None:
        if len(self.ok) + self.dead >= self.n and self.done_at is None:
            self.done_at = time.monotonic()
            self.done.set()


def app_flood(args: dict[str, Any]) -> None:
    """Args: bootstrap, topic, group, n, rate, down_from_s, down_until_s, delays_ms, guarded, partitions,
    consumer_overrides, timeout_s."""
    tally = _Tally(args["n"])
    tally.down = (float(args["down_from_s"]), float(args["down_until_s"]))
    tally.backlog = set(range(min(args["n"], int(tally.down[1] * args["rate"]))))
    app = RetryApp(
        kafka=KafkaConfig(bootstrap=args["bootstrap"]),
        group=args["group"],
        consumer_overrides=args.get("consumer_overrides", {}),
        hooks=[tally],
        on_dead_letter=lambda record, route: tally.dead_lettered(int(record.raw_value or b"")),
    )
    policy = RetryPolicy(delays=[f"{d}ms" for d in args["delays_ms"]])

    @app.handler(args["topic"], policy=policy, flood_guard=GUARD if args["guarded"] else None)
    def handle(record: Record[bytes]) -> None:
        i = int(record.raw_value or b"")
        with tally.lock:
            tally.calls += 1
            if tally.is_down(time.monotonic()):
                tally.calls_down += 1
                raise ConnectionError("the dependency is down")
        tally.handled(i)

    app.provision()
    app.start(main=True, tiers="all")
    producer = Producer({"bootstrap.servers": args["bootstrap"], "linger.ms": 5})
    try:
        tally.t0 = started = time.monotonic()
        for i in range(args["n"]):
            # paced from the start, not from the last record: a slow produce call catches up
            pause = started + i / args["rate"] - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            producer.produce(args["topic"], value=str(i).encode(), key=str(i).encode())
            producer.poll(0)
        producer.flush(30)
        if not tally.done.wait(args["timeout_s"]):
            raise TimeoutError(f"{len(tally.ok)} handled, {tally.dead} dead-lettered of {args['n']}")
    finally:
        app.stop()
    assert tally.backlog_at is not None
    emit(
        "done",
        ok=len(tally.ok),
        dead=tally.dead,
        calls=tally.calls,
        calls_down=tally.calls_down,
        openings=tally.openings,
        probes=tally.probes,
        caught_up_s=tally.backlog_at - (started + tally.down[1]),
    )


def main(argv: list[str]) -> int:
    return run_role({"app_flood": app_flood}[argv[0]], json.loads(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
