"""6. Growth: the success path at increasing N; handling wall time (first record to N-th) and peak RSS of the
runtime's process. Baselines are the smallest N scaled linearly (time) or unchanged (RSS): ratio ~1 means
linear time and flat memory.
"""

from __future__ import annotations

from bench.context import Bench
from bench.load import create_topics, fill
from bench.report import Result

NAME = "6.growth"


def run(b: Bench) -> list[Result]:
    sizes = b.size([10_000, 50_000], [10_000, 100_000, 1_000_000])
    results: list[Result] = []
    first: dict[str, float] = {}
    for n in sizes:
        topic = b.name("growth")
        create_topics(b.kafka, [topic], b.partitions)
        fill(b.kafka, topic, n, partitions=b.partitions)
        done = b.run_to_done("app_success", {"topic": topic, "group": b.name("app"), "n": n})
        first = first or {"n": n, "seconds": done["seconds"], "rss": done["peak_rss_mb"]}
        results += [
            Result(
                scenario="6.growth.time",
                n=n,
                value=done["seconds"],
                unit="s",
                baseline=first["seconds"] * n / first["n"],
                extra={"records_per_s": done["rate"]},
            ),
            Result(scenario="6.growth.rss", n=n, value=done["peak_rss_mb"], unit="MB peak RSS", baseline=first["rss"]),
        ]
    return results
