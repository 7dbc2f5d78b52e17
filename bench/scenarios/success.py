"""1. Success path: records/s through a decorated no-op handler, and a no-op batch handler, vs a hand-written
consume-and-commit loop.

Both read the same pre-filled topic in their own consumer group, with the same batch size (500) and the same
commit policy (asynchronous commit of the handled positions every 500 records or 1 s).
"""

from __future__ import annotations

from bench.context import Bench
from bench.load import create_topics, fill
from bench.report import Result, Target

NAME = "1.success"
BATCH = 500


def run(b: Bench) -> list[Result]:
    n = b.size(100_000, 1_000_000)
    topic = b.name("success")
    create_topics(b.kafka, [topic], b.partitions)
    fill(b.kafka, topic, n, partitions=b.partitions)
    raw, app, batch = [], [], []
    for _ in range(b.size(1, 2)):  # alternate, keep each side's best: the broker shares the cores
        raw.append(
            b.run_to_done(
                "raw_consume",
                {
                    "topic": topic,
                    "group": b.name("raw"),
                    "n": n,
                    "batch": BATCH,
                    "commit_every": BATCH,
                    "commit_interval_s": 1.0,
                },
            )
        )
        app.append(b.run_to_done("app_success", {"topic": topic, "group": b.name("app"), "n": n}))
        batch.append(b.run_to_done("app_success_batch", {"topic": topic, "group": b.name("batch"), "n": n}))
    best_raw = max(raw, key=lambda d: d["rate"])
    best_app = max(app, key=lambda d: d["rate"])
    best_batch = max(batch, key=lambda d: d["rate"])
    return [
        Result(
            scenario=NAME,
            n=n,
            value=best_app["rate"],
            unit="records/s",
            baseline=best_raw["rate"],
            target=Target(">=", 0.35, on="ratio"),
            extra={
                "app_peak_rss_mb": best_app["peak_rss_mb"],
                "raw_peak_rss_mb": best_raw["peak_rss_mb"],
                "app_cpu_us_per_record": best_app["cpu_us_per_record"],
            },
        ),
        Result(
            scenario=f"{NAME}.batch",
            n=n,
            value=best_batch["rate"],
            unit="records/s",
            baseline=best_raw["rate"],
            target=Target(">=", 0.8, on="ratio"),
            extra={
                "app_peak_rss_mb": best_batch["peak_rss_mb"],
                "app_cpu_us_per_record": best_batch["cpu_us_per_record"],
            },
        ),
    ]
