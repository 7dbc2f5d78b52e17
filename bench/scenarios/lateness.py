"""3. Lateness: 10,000 tier records all fall due within one second, after the tier consumer has paused on
them; handled_at - retry.due_at per record (measured in the handler), p50/p99/max, and the minimum (never < 0).
"""

from __future__ import annotations

import time

from bench.context import Bench
from bench.load import create_topics, fill, tier_headers, tier_topics
from bench.report import Result, Target, percentile

NAME = "3.lateness"
DELAY_MS = 30_000
LEAD_MS = 9_000  # child start-up (~1.5 s) + group join (~3 s) + first fetch and pause, with room to spare


def run(b: Bench) -> list[Result]:
    n = 10_000
    source, group = b.name("lateness"), b.name("app")
    ts = tier_topics(source, group, [DELAY_MS])
    create_topics(b.kafka, [source, *ts.all_topics], b.partitions)
    due0 = int(time.time() * 1000) + LEAD_MS

    def headers(i: int, partition: int) -> list[tuple[str, bytes | None]]:
        due = due0 + i * 1000 // n  # ascending within each partition, spread over one second
        return tier_headers(ts, tier=0, due_at=due, failed_at=due - DELAY_MS, offset=i, partition=partition)

    fill(b.kafka, ts.tiers[0].topic, n, partitions=b.partitions, headers=headers)
    with b.child("app_tiers", {"topic": source, "group": group, "delay": f"{DELAY_MS}ms", "n": n}) as child:
        child.wait_for("ready", timeout_s=60)
        paused_before_due = True
        try:
            child.wait_for("paused", timeout_s=max(1.0, (due0 - time.time() * 1000) / 1000))
        except Exception:  # noqa: BLE001 - still measured, but flagged: the consumer joined too late
            paused_before_due = False
        done = child.wait_for("done", timeout_s=120)
    late: list[float] = done["lateness_ms"]
    note = "" if paused_before_due else "the tier consumer had not paused every partition before the due time"
    # Lateness growing from the first handled record to the last means the tier consumer handles fewer
    # than n records per second; a flat offset means a fixed wake-up delay.
    shape = {"records_per_s": done["rate"], "first_handled_late_ms": late[0], "last_handled_late_ms": late[-1]}
    common = {"n": len(late), "unit": "ms", "extra": shape}
    return [
        Result(scenario="3.lateness.p50", value=percentile(late, 50), note=note, **common),
        Result(scenario="3.lateness.p99", value=percentile(late, 99), target=Target("<=", 100), **common),
        Result(scenario="3.lateness.max", value=max(late), **common),
        Result(scenario="3.lateness.min", value=min(late), target=Target(">=", 0), **common),
    ]  # type: ignore[arg-type]
