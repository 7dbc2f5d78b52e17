"""11. Share groups: records/s through a handler that sleeps 10 ms, on a one-partition topic, with 1, 2 and 4
share-group members (`RetryApp(consumer="share")`, in one process) against one consumer-group member, the
most a consumer group can put on one partition. Target: 4 members at least 3x the consumer group.

The topic is written one record per producer batch: the broker acquires whole producer batches for one
member (docs/share-groups.md), so records written in large batches would not spread over members at all.
Each member polls at most `BATCH` records. Rates run from the first handler call to the n-th distinct
record, so they include the later members' joining (1-4 s with a 1 s group heartbeat).
"""

from __future__ import annotations

from bench.context import Bench
from bench.load import create_topics, fill
from bench.report import Result, Target
from retrytopics.connectors.admin import ShareGroupConfig, set_share_group_config
from retrytopics.connectors.kafka import make_admin

NAME = "11.share"
HANDLER_MS = 10
BATCH = 10
MEMBERS = (1, 2, 4)


def run(b: Bench) -> list[Result]:
    n = b.size(2_000, 6_000)
    topic = b.name("share")
    create_topics(b.kafka, [topic], 1)
    fill(b.kafka, topic, n, partitions=1, exact_end_offsets=True)  # one record per producer batch
    common = {"topic": topic, "n": n, "handler_ms": HANDLER_MS, "batch": BATCH}
    group = b.run_to_done("app_share", {**common, "group": b.name("group"), "members": 1, "consumer": "group"})
    admin = make_admin(b.kafka)
    results = []
    for members in MEMBERS:
        name = b.name("shared")
        # before the first member joins: from the earliest record, and a quick join
        set_share_group_config(admin, name, ShareGroupConfig(auto_offset_reset="earliest", heartbeat_interval_ms=1000))
        shared = b.run_to_done("app_share", {**common, "group": name, "members": members, "consumer": "share"})
        results.append(
            Result(
                scenario=f"{NAME}.{members}",
                n=n,
                value=shared["rate"],
                unit="records/s",
                baseline=group["rate"],
                target=Target(">=", 3.0, on="ratio") if members == 4 else None,
                note=f"{members} share consumer(s) vs 1 consumer-group consumer, {HANDLER_MS} ms handler, 1 partition",
                extra={"duplicates": shared["duplicates"], "group_duplicates": group["duplicates"]},
            )
        )
    return results
