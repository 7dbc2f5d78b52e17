"""2. Failure path: every record fails once and is republished to tier 1; acknowledged republishes per second
vs a raw idempotent producer sending the same bytes (the same value and the very headers the runtime wrote).
"""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from bench.context import Bench
from bench.load import create_topics, fill, tier_topics
from bench.report import Result, Target

NAME = "2.failure"
HOUR_MS = 3_600_000


def run(b: Bench) -> list[Result]:
    n = b.size(30_000, 300_000)
    source, group = b.name("failure"), b.name("app")
    create_topics(b.kafka, [source], b.partitions)
    fill(b.kafka, source, n, partitions=b.partitions)
    app = b.run_to_done("app_failure", {"topic": source, "group": group, "n": n})
    tier = tier_topics(source, group, [HOUR_MS]).tiers[0].topic
    headers = _first_headers(b, tier)
    target_topic = b.name("rawproduce")
    create_topics(b.kafka, [target_topic], b.partitions)
    raw = b.run_to_done(
        "raw_produce",
        {"topic": target_topic, "n": n, "value_size": 100, "headers": [[k, (v or b"").decode()] for k, v in headers]},
    )
    return [
        Result(
            scenario=NAME,
            n=n,
            value=app["rate"],
            unit="records/s",
            baseline=raw["rate"],
            target=Target(">=", 0.5, on="ratio"),
            extra={
                "header_bytes": sum(len(k) + len(v or b"") for k, v in headers),
                "app_peak_rss_mb": app["peak_rss_mb"],
                "app_cpu_us_per_record": app["cpu_us_per_record"],
            },
        )
    ]


def _first_headers(b: Bench, topic: str) -> list[tuple[str, bytes | None]]:
    """The headers of a record the runtime republished (so the raw producer sends the same bytes)."""
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench-peek", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        for _ in range(30):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                return list(msg.headers() or [])
        raise RuntimeError(f"no republished record found in {topic}")
    finally:
        consumer.close()
