"""Entry point of a measured child process: ``python -m bench.child <role> '<json args>'``.

The role's prefix picks its module: `raw_*` (hand-written confluent-kafka baselines) in `bench.raw`,
`app_*` (the runtime under test) in `bench.runtime`, `spark_*` in `bench.sparkjobs`, `floor_*` (the least
a Python program must do per record) in `bench.floor`, `console_*` in `bench.consolejobs`. Only the chosen module
is imported, so the child's memory holds nothing the role does not use.
"""

from __future__ import annotations

import importlib
import json
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

from bench.measure import emit

_MODULES = {
    "raw": "bench.raw",
    "app": "bench.runtime",
    "spark": "bench.sparkjobs",
    "floor": "bench.floor",
    "console": "bench.consolejobs",
}


def main(argv: list[str]) -> int:
    role, args = argv[0], json.loads(argv[1])
    module = importlib.import_module(_MODULES[role.split("_", 1)[0]])
    return run_role(getattr(module, role), args)


def run_role(run: Callable[[Any], None], args: Any) -> int:
    """Run one role to its end, as every child does: 0 when it ends or is stopped, 1 after an error event."""
    # SIGTERM from the harness becomes KeyboardInterrupt, so that roles can stop their loops cleanly.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run(args)
    except KeyboardInterrupt:
        return 0
    except BaseException as exc:  # noqa: BLE001 - reported to the harness, which raises ChildFailed
        emit("error", error=repr(exc), trace=traceback.format_exc()[-2000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
