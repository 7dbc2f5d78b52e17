"""5. Idle cost: every partition of a "1h" tier paused; CPU of the tier consumer process over the window,
as a percentage of one core, vs a hand-written pause-and-seek consumer running beside it.
"""

from __future__ import annotations

import time

from bench.context import Bench
from bench.report import Result, Target
from bench.scenarios.backlog import tier_consumers, waiting_tier

NAME = "5.idle"


def run(b: Bench) -> list[Result]:
    window_s = b.size(15.0, 60.0)
    source, group = waiting_tier(b, 300)
    app, raw = tier_consumers(b, source, group)
    with app, raw:
        app.wait_for("paused", timeout_s=90)
        raw.wait_for("paused", timeout_s=90)
        time.sleep(window_s)
        (app_cpu, app_wall), (raw_cpu, raw_wall) = app.cpu_since("paused"), raw.cpu_since("paused")
    return [
        Result(
            scenario=NAME,
            n=b.partitions,
            value=100 * app_cpu / app_wall,
            unit="% of a core",
            baseline=100 * raw_cpu / raw_wall,
            target=Target("<=", 1.0),
            note=f"{b.partitions} partitions paused for {app_wall:.0f} s; n = partitions",
            extra={"app_cpu_s": app_cpu, "raw_cpu_s": raw_cpu},
        )
    ]
