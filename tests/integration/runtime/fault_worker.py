"""A main-consumer process for the kill, stop and signal tests: `python fault_worker.py '<json settings>'`.

Runs `app.run()` (so SIGTERM/SIGINT are handled as in production) over one source topic whose values say
what the handler does on each attempt (`"<id>:<behaviour>"`):

- `ok`: succeeds; `fail`: always raises (retried through the tiers, then the DLQ); `bad`: `NonRetryable`;
- `kill`: in the worker process, SIGKILLs it inside the handler on attempt 1 (so before any republish);
  elsewhere (an app the test restarts in its own process) it fails on attempt 1 and succeeds after;
- `block`: writes its ledger entry, then waits (at most 30 s) until the file `release` exists, and raises
  `NonRetryable`. The test SIGSTOPs or SIGTERMs the process meanwhile, so the signal lands inside the handler
  for sure; an app built without `release` does not wait;
- `hang`: writes its ledger entry, then never returns (in the worker process; elsewhere it succeeds).

`exactly_once` (default false) runs the app in that mode, `producer` gives it producer overrides. `kill_on` names an event (`retry.scheduled`, `dlq.dispatched`): the process SIGKILLs itself the first time
that event fires, i.e. right after the broker acknowledged a hand-off and before its source offset can be
committed. Every handler call is appended to a JSON-lines ledger and flushed before the behaviour runs, so a
SIGKILL loses nothing the test needs to know.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retrytopics import Event, KafkaConfig, NonRetryable, Record, RetryApp, RetryPolicy

WORKER = Path(__file__)


class KillOn:
    """A hook that SIGKILLs this process the first time `event` fires."""

    def __init__(self, event: str) -> None:
        self.event = Event(event)

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event is self.event:
            os.kill(os.getpid(), signal.SIGKILL)


def build_app(
    settings: dict[str, Any], ledger_path: str, *, hooks: tuple[Any, ...] = (), in_worker: bool = False, **options: Any
) -> RetryApp:
    """The scenario's app; the test process builds the same one (with its own ledger) to restart it."""
    kafka = KafkaConfig(bootstrap=settings["bootstrap"], producer_overrides={"batch.num.messages": 1})
    app = RetryApp(
        kafka=kafka, group=settings["group"], consumer_overrides=settings["consumer"], hooks=hooks, **options
    )
    ledger = open(ledger_path, "a", buffering=1)

    @app.handler(settings["source"], policy=RetryPolicy(delays=settings["delays"]))
    def handle(record: Record[bytes]) -> None:
        ident, behaviour = record.value.decode().split(":")
        entry = {
            "id": ident,
            "attempt": record.attempt,
            "topic": record.topic,
            "offset": record.offset,
            "at": time.time() * 1000,
            "due_at": record.retry.due_at if record.retry else None,
            "pid": os.getpid(),
        }
        ledger.write(json.dumps(entry) + "\n")
        ledger.flush()
        if behaviour == "kill" and record.attempt == 1 and in_worker:
            os.kill(os.getpid(), signal.SIGKILL)
        if behaviour == "hang" and in_worker:
            threading.Event().wait()
        if behaviour == "block":
            release = Path(settings["release"]) if settings.get("release") else None
            deadline = time.monotonic() + 30
            while release is not None and not release.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            raise NonRetryable(RuntimeError(f"{ident} failed after being interrupted"))
        if behaviour == "bad":
            raise NonRetryable(ValueError(f"{ident} is invalid"))
        if behaviour == "fail" or (behaviour == "kill" and record.attempt == 1):
            raise RuntimeError(f"{ident} failed on attempt {record.attempt}")

    return app


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The ledger's entries (a line cut by SIGKILL is skipped)."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return entries


def spawn(settings: dict[str, Any], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a worker (with `env` added to this process's environment); its log (stderr) goes to the file
    `settings["log"]`, readable while it runs."""
    with open(settings["log"], "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    hooks = (KillOn(settings["kill_on"]),) if settings.get("kill_on") else ()
    app = build_app(
        settings,
        settings["ledger"],
        hooks=hooks,
        in_worker=True,
        commit_every=1,
        exactly_once=settings.get("exactly_once", False),
        producer_overrides=settings.get("producer", {}),
    )
    app.run()


if __name__ == "__main__":
    main()
