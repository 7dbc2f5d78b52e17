"""A tier-consumer process for the crash test: `python tier_worker.py '<json settings>'`.

Runs one tier of the crash scenario's app and appends every handler call to a JSON-lines ledger (flushed
before the handler returns or raises), so that a SIGKILL loses nothing the test needs to know.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from retrytopics import KafkaConfig, Record, RetryApp, RetryPolicy

POLICY = RetryPolicy(delays=["300ms", "600ms"])


def failures_planned(i: int) -> int:
    """Record i fails twice (i % 3 == 0), once (i % 3 == 1) or never."""
    return {0: 2, 1: 1}.get(i % 3, 0)


def build_app(settings: dict[str, Any], ledger_path: str, **app_options: Any) -> RetryApp:
    kafka = KafkaConfig(bootstrap=settings["bootstrap"], producer_overrides={"batch.num.messages": 1})
    app = RetryApp(kafka=kafka, group=settings["group"], consumer_overrides=settings["consumer"], **app_options)
    ledger = open(ledger_path, "a", buffering=1)

    @app.handler(settings["source"], policy=POLICY)
    def handle(record: Record[bytes]) -> None:
        i = int(record.value)
        ok = record.attempt > failures_planned(i)
        entry = {
            "id": i,
            "attempt": record.attempt,
            "at": time.time() * 1000,
            "pid": os.getpid(),
            "ok": ok,
            "due_at": record.retry.due_at if record.retry else None,
        }
        time.sleep(settings.get("work_s", 0))
        ledger.write(json.dumps(entry) + "\n")
        ledger.flush()
        if not ok:
            raise RuntimeError(f"record {i} attempt {record.attempt}")

    return app


def main() -> None:
    settings = json.loads(sys.argv[1])
    options = {
        "commit_interval": settings["commit_interval"],
        "commit_every": settings["commit_every"],
        "commit_on_ack": settings.get("commit_on_ack", True),
        "dedupe_seed": settings.get("dedupe_seed", 1000),
    }
    app = build_app(settings, settings["ledger"], **options)
    app.run_tiers(tiers=[settings["tier"]])


if __name__ == "__main__":
    main()
