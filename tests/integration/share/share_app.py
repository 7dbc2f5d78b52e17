"""A share-group `RetryApp` in a process of its own, for the tests that kill one:
`python share_app.py BOOTSTRAP GROUP TOPIC CALLS_FILE MODE`.

Every handler call appends `<pid> <value>` to CALLS_FILE (flushed, so a SIGKILL loses no line). MODE:
`run` handles everything; `hold` blocks in its second call (the first call's acknowledgement is not
committed yet) after printing `holding`, until the test kills it; `kill:<value>` SIGKILLs the process
whenever it handles that value (a crash loop). Tier and DLQ topics are provisioned by the test.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from retrytopics import KafkaConfig, RetryApp, RetryPolicy
from retrytopics.core.record import Record


def main(bootstrap: str, group: str, topic: str, calls_file: str, mode: str) -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap=bootstrap), group=group, consumer="share")
    calls = open(calls_file, "a", buffering=1)
    handled = 0

    @app.handler(topic, policy=RetryPolicy(delays=["1s"]))
    def handle(record: Record[bytes]) -> None:
        nonlocal handled
        calls.write(f"{os.getpid()} {record.value.decode()}\n")
        handled += 1
        if mode == "hold" and handled == 2:
            print("holding", flush=True)
            while True:
                time.sleep(1)
        if mode == f"kill:{record.value.decode()}":
            os.kill(os.getpid(), signal.SIGKILL)

    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:6])
