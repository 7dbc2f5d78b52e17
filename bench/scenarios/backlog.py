"""4. Backlog memory: records waiting, not yet due, in a "1h" tier; RSS of the tier consumer process while
it holds every partition paused, vs a hand-written pause-and-seek consumer on the same topic (both run side
by side). Data must wait in Kafka, not in the process: RSS stays flat whatever the backlog.
"""

from __future__ import annotations

import time

from bench.context import Bench
from bench.load import create_topics, fill, tier_headers, tier_topics
from bench.measure import Child
from bench.report import Result, Target

NAME = "4.backlog"
HOUR_MS = 3_600_000


def waiting_tier(b: Bench, n: int) -> tuple[str, str]:
    """A "1h" tier holding `n` records due in about an hour; returns (source, group)."""
    source, group = b.name("backlog"), b.name("app")
    ts = tier_topics(source, group, [HOUR_MS])
    create_topics(b.kafka, [source, *ts.all_topics], b.partitions)
    now = int(time.time() * 1000)
    # One header set for all: the consumer never gets past each partition's head record.
    headers = tier_headers(ts, tier=0, due_at=now + HOUR_MS - 60_000, failed_at=now)
    fill(b.kafka, ts.tiers[0].topic, n, partitions=b.partitions, headers=lambda i, p: headers)
    return source, group


def tier_consumers(b: Bench, source: str, group: str) -> tuple[Child, Child]:
    """The runtime's tier consumer and a raw pause-and-seek consumer of the same tier (not started yet)."""
    tier = tier_topics(source, group, [HOUR_MS]).tiers[0].topic
    app = b.child("app_tiers", {"topic": source, "group": group, "delay": "1h"})
    raw = b.child("raw_paused", {"topic": tier, "group": b.name("raw")})
    return app, raw


def run(b: Bench) -> list[Result]:
    n = b.size(200_000, 1_000_000)
    window_s = b.size(5.0, 20.0)
    source, group = waiting_tier(b, n)
    app, raw = tier_consumers(b, source, group)
    with app, raw:
        app.wait_for("paused", timeout_s=90)
        raw.wait_for("paused", timeout_s=90)
        time.sleep(window_s)
        figures = {name: _memory(child) for name, child in (("app", app), ("raw", raw))}
    a, r = figures["app"], figures["raw"]
    return [
        Result(
            scenario=NAME,
            n=n,
            value=a["peak"],
            unit="MB peak RSS",
            baseline=r["peak"],
            target=Target("<=", 200),
            extra={f"{k}_{side}": v for side, f in figures.items() for k, v in f.items()},
        ),
        Result(
            scenario="4.backlog.drift",
            n=n,
            value=a["drift"],
            unit="MB",
            note=f"RSS change over {window_s:.0f} s with every partition paused (raw consumer: {r['drift']:+.1f} MB)",
        ),
    ]


def _memory(child: Child) -> dict[str, float]:
    mb = 2**20
    after = child.samples_since("paused")
    return {
        "peak": child.peak_rss() / mb,
        "at_paused": after[0].rss / mb,
        "end": after[-1].rss / mb,
        "drift": (after[-1].rss - after[0].rss) / mb,
    }
