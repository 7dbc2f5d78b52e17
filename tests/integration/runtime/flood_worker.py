"""A process for the retry-flood guard's SIGKILL test: `python flood_worker.py '<json settings>'`.

Runs the main consumer and every tier of a guarded handler whose dependency is up while the file
`settings["up"]` exists, and appends to a JSON-lines ledger (flushed at once, so a SIGKILL loses nothing the test
needs to know) every handler call, every dead letter and the guard's openings and probes. The test builds the
same app in its own process (`build_app`, with its own ledger) to restart it.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retrytopics import Event, FloodGuard, KafkaConfig, Record, RetryApp, RetryPolicy
from retrytopics.core.router import Route

POLICY = RetryPolicy(delays=["200ms", "400ms"])
GUARD = FloodGuard(
    failure_ratio=0.5, min_calls=10, window="5s", backoff="500ms", max_backoff="1s", ramp="1s", ramp_start=100.0
)


class Ledger:
    """A JSON-lines file every entry is flushed to at once; also the app's event hook."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, **entry: object) -> None:
        with self._lock:
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event in (Event.FLOOD_GUARD_OPENED, Event.FLOOD_GUARD_PROBED):
            self.write(event=str(event), detail=data.get("succeeded", data.get("reason")))

    def on_dead_letter(self, record: Record[bytes], route: Route) -> None:
        self.write(dead=int(record.value), reason=str(route.reason))


def build_app(settings: dict[str, Any], ledger_path: str) -> RetryApp:
    """The scenario's app: `settings["guarded"]` false builds it without the guard."""
    ledger = Ledger(ledger_path)
    kafka = KafkaConfig(bootstrap=settings["bootstrap"], producer_overrides={"batch.num.messages": 1})
    app = RetryApp(
        kafka=kafka,
        group=settings["group"],
        consumer_overrides=settings["consumer"],
        commit_interval="200ms",
        hooks=[ledger],
        on_dead_letter=ledger.on_dead_letter,
    )
    up = Path(settings["up"])

    @app.handler(settings["source"], policy=POLICY, flood_guard=GUARD if settings.get("guarded", True) else None)
    def handle(record: Record[bytes]) -> None:
        ok = up.exists()
        ledger.write(id=int(record.value), attempt=record.attempt, topic=record.topic, ok=ok)
        if not ok:
            raise ConnectionError("the payment gateway is down")

    return app


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = build_app(settings, settings["ledger"])
    app.start(main=True, tiers="all")
    app.wait()  # until the test SIGKILLs it


if __name__ == "__main__":
    main()
