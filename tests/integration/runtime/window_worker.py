"""A main-consumer process for the SIGKILL-mid-window test: `python window_worker.py '<json settings>'`.

Runs an app whose handler has `concurrency=WINDOW` over one source topic. Each call appends `start <id>` to a
ledger file (flushed), waits 20 ms, then appends `end <id>`; the call on id `kill` SIGKILLs the process after
its `start` line, with the other calls of the window in flight. Settings: bootstrap, source, group, ledger,
kill, consumer_overrides.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from retrytopics import KafkaConfig, Record, RetryApp, RetryPolicy

WINDOW = 16
COMMIT_EVERY = 5


def build_app(settings: dict[str, object], ledger: Path, *, kill: int | None) -> RetryApp:
    app = RetryApp(
        kafka=KafkaConfig(bootstrap=str(settings["bootstrap"])),
        group=str(settings["group"]),
        consumer_overrides=dict(settings["consumer_overrides"]),  # type: ignore[call-overload]
        commit_every=COMMIT_EVERY,
        commit_interval="100ms",
    )
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock, ledger.open("a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    @app.handler(str(settings["source"]), policy=RetryPolicy(delays=["1s"]), concurrency=WINDOW)
    def handle(record: Record[bytes]) -> None:
        i = int(record.value)
        write(f"start {i}")
        if i == kill:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.02)
        write(f"end {i}")

    return app


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    build_app(config, Path(config["ledger"]), kill=config["kill"]).run()
