"""13. A retry flood (issue 33, docs/flood-guard.md): records arrive at 250/s while the handler's dependency is
down for a while, with tiers shorter in all than the outage; a `RetryApp` without a flood guard, then with one
(bench/floodjobs.py), each in its own child process.

Figures: good records dead-lettered (every record is good), tier records written, handler calls while the
dependency was down, and seconds from its recovery until every record produced before it settled (the
outage's backlog caught up). Targets (issue 33): 0 dead
letters with the guard, at least 10x fewer calls while down. Every run is accounted: each id handled or
dead-lettered, none lost.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.context import CONSUMER_OVERRIDES, Bench
from bench.load import create_topics, tier_topics
from bench.measure import Child
from bench.report import Result, Target

NAME = "13.flood"
RATE = 250


def run(b: Bench) -> list[Result]:
    # quick: 3,000 records over 12 s, down from 3 s to 9 s, tiers 0.5/1/2 s; full: the 7,500 over 30 s,
    # down from 5 s to 20 s, tiers 1/2/4 s
    n, down, delays = b.size((3_000, (3, 9), [500, 1_000, 2_000]), (7_500, (5, 20), [1_000, 2_000, 4_000]))
    plain = _side(b, n, down, delays, guarded=False)
    guarded = _side(b, n, down, delays, guarded=True)
    note = f"{n:,} records at {RATE}/s, dependency down {down[0]}-{down[1]} s, tiers {delays} ms"
    return [
        Result(
            scenario=f"{NAME}.dead_letters",
            n=n,
            value=guarded["dead"],
            unit="records",
            baseline=plain["dead"],
            target=Target("<=", 0),
            note=f"{note}; baseline: without the guard",
            extra={"tier_records": guarded["tier_records"], "tier_records_unguarded": plain["tier_records"]},
        ),
        Result(
            scenario=f"{NAME}.calls_while_down",
            n=n,
            value=guarded["calls_down"],
            unit="calls",
            baseline=plain["calls_down"],
            target=Target("<=", 0.1, on="ratio"),
            note="handler calls while the dependency was down; baseline: without the guard",
            extra={"openings": guarded["openings"], "probes": guarded["probes"]},
        ),
        Result(
            scenario=f"{NAME}.caught_up",
            n=n,
            value=guarded["caught_up_s"],
            unit="s",
            baseline=plain["caught_up_s"],
            note="from the dependency's recovery until every record produced before it settled; baseline: without "
            "the guard",
        ),
    ]


def _side(b: Bench, n: int, down: tuple[int, int], delays: list[int], *, guarded: bool) -> dict[str, Any]:
    label = "guarded" if guarded else "plain"
    source, group = b.name(f"flood.{label}"), b.name(f"flood.{label}.app")
    create_topics(b.kafka, [source], b.partitions)
    args = {
        "bootstrap": b.bootstrap,
        "topic": source,
        "group": group,
        "n": n,
        "rate": RATE,
        "down_from_s": down[0],
        "down_until_s": down[1],
        "delays_ms": delays,
        "guarded": guarded,
        "partitions": b.partitions,
        "consumer_overrides": CONSUMER_OVERRIDES,
        "timeout_s": 180,
    }
    with Child("bench.floodjobs", "app_flood", args) as child:
        done = child.wait_for("done", timeout_s=240)
        child.join(timeout_s=60)
    if done["ok"] + done["dead"] != n or done["ok"] > n:
        raise RuntimeError(f"{label}: {done['ok']} handled + {done['dead']} dead-lettered != {n}")
    done["tier_records"] = _records(b, [t.topic for t in tier_topics(source, group, delays).tiers])
    return done


def _records(b: Bench, topics: list[str]) -> int:
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench-flood-read", "enable.auto.commit": False})
    try:
        total = 0
        for topic in topics:
            for p in range(b.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high - low
        return total
    finally:
        consumer.close()
