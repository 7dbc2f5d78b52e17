"""A main-consumer process that SIGKILLs itself in the middle of a backlog: `python backlog_worker.py '<json>'`.

The app of `fault_worker.build_app`, with the product's commit settings (not `commit_every=1`), SIGKILLed
the `kill_after`-th time the event `kill_on` fires (e.g. the 150th `dlq.dispatched`): right after a DLQ
acknowledgement, with whatever the loop had not committed yet left to the next owner.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retrytopics import Event

if __package__ in (None, ""):  # run as a script: import the sibling module
    sys.path.insert(0, str(Path(__file__).parent))
    from fault_worker import build_app  # type: ignore[import-not-found,no-redef]
else:
    from .fault_worker import build_app

WORKER = Path(__file__)


class KillAfter:
    """A hook that SIGKILLs this process the `count`-th time `event` fires."""

    def __init__(self, event: str, count: int) -> None:
        self.event, self.left = Event(event), count

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event is self.event:
            self.left -= 1
            if self.left <= 0:
                os.kill(os.getpid(), signal.SIGKILL)


def spawn(settings: dict[str, Any]) -> subprocess.Popen[bytes]:
    with open(settings["log"], "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )


def main() -> None:
    settings = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = build_app(
        settings, settings["ledger"], hooks=(KillAfter(settings["kill_on"], settings["kill_after"]),), in_worker=True
    )
    app.run()


if __name__ == "__main__":
    main()
