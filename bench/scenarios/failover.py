"""10. Failover: the stall and lateness around a SIGKILLed partition leader on a 3-node Apache Kafka cluster
(KRaft, replication factor 3, min.insync.replicas 2), with the client settings the stall might depend on.

Runs the drill of bench/drill.py (2,400 records at 200 a second through two tiers and the DLQ, the leader
restarted 10 s after its kill) on clusters of its own, whatever broker the run uses. The value is the stall:
the longest time after the kill in which no source record was handled. `extra` splits the source lateness
into the time the cluster took to acknowledge a record (acks=all) and the time it then waited in the source
topic for the app, and carries the ledger's counts (lost, early, duplicate dead letters: all must be 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench.context import Bench
from bench.drill import DrillPlan, Outcome, kill_partition_leader, run_drill
from bench.report import Result
from retrytopics.connectors.cluster import KafkaCluster

NAME = "10.failover"


@dataclass(frozen=True)
class Variant:
    label: str
    consumer: Mapping[str, str | int] = field(default_factory=dict)
    cluster: tuple[tuple[str, str], ...] = ()  # server.properties entries beyond connectors.cluster's
    exactly_once: bool = False
    coordinator_killed: bool = False  # kill the node that is also the app's group coordinator


VARIANTS = [
    Variant("alo.defaults"),
    Variant("alo.coordinator-killed", coordinator_killed=True),
    Variant("alo.session-6s", {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}),
    Variant("alo.group-protocol-consumer", {"group.protocol": "consumer"}),
    Variant("alo.metadata-refresh-1s", {"topic.metadata.refresh.interval.ms": 1000, "metadata.max.age.ms": 3000}),
    Variant("eos.defaults", exactly_once=True),
    Variant(
        "alo.broker-session-4s",
        cluster=(("broker.session.timeout.ms", "4000"), ("broker.heartbeat.interval.ms", "1000")),
    ),
]
QUICK = ("alo.defaults", "eos.defaults", "alo.broker-session-4s")


def run(b: Bench) -> list[Result]:
    by_cluster: dict[tuple[tuple[str, str], ...], list[Variant]] = {}
    for variant in VARIANTS:
        if not b.quick or variant.label in QUICK:
            by_cluster.setdefault(variant.cluster, []).append(variant)
    ids = itertools.count()
    results = []
    for settings, variants in by_cluster.items():
        with KafkaCluster(settings=dict(settings)) as cluster:
            for variant in variants:
                plan = DrillPlan(exactly_once=variant.exactly_once, consumer_overrides=variant.consumer)
                fault = kill_partition_leader(coordinator=variant.coordinator_killed)
                outcome = run_drill(cluster, plan, fault, name=lambda stem: f"bench.{stem}.{next(ids)}")
                results.append(_result(variant.label, plan, outcome))
    return results


def _result(label: str, plan: DrillPlan, outcome: Outcome) -> Result:
    ledger_ok = not (
        outcome.lost or outcome.early or outcome.duplicate_dead_letters or outcome.committed_tier_duplicates
    )
    return Result(
        scenario=f"{NAME}.{label}.stall",
        n=plan.records,
        value=outcome.stall_s,
        unit="s",
        note=outcome.fault + ("" if ledger_ok else "; LEDGER NOT CLEAN: " + outcome.summary()),
        extra={
            "source_lateness_max_s": round(outcome.max_source_lateness_s, 2),
            "produce_ack_max_s": round(outcome.max_produce_delay_s, 2),
            "waiting_in_source_max_s": round(outcome.max_source_wait_s, 2),
            "tier_lateness_max_s": round(outcome.max_tier_lateness_s, 2),
            "lost": len(outcome.lost),
            "early": len(outcome.early),
            "duplicate_dead_letters": sum(outcome.duplicate_dead_letters.values()),
            "committed_tier_duplicates": sum(outcome.committed_tier_duplicates.values()),
            "extra_handler_calls": outcome.extra_calls,
            "coordinator_killed": str(outcome.coordinator_killed),
        },
    )
