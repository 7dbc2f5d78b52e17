"""On the project's 3-node Apache Kafka cluster (KRaft, 3 voters, replication factor 3, min.insync.replicas 2),
the tests that run in every suite run (the long failover scenarios are in test_failover_slow.py):

- the cluster starts with every node registered and a controller elected; when the active controller is
  SIGKILLed another node takes over, acks=all writes keep succeeding with one node down, and the node comes
  back with its data;
- provisioning gives tiers and the DLQ the replication factor and min.insync.replicas asked for, `topics
  describe` shows them, and a tier less durable than its source is named in a warning;
- a partition leader SIGKILLed mid-run and restarted costs nothing at-least-once: every id handled or
  dead-lettered, none handled before it was due, no duplicate dead letter (the stall is printed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

import pytest
from confluent_kafka import Producer

from retrytopics import RetryApp
from retrytopics.connectors.admin import TopicSpec, ensure_topics, topic_durability
from retrytopics.connectors.cluster import KafkaCluster
from retrytopics.connectors.kafka import make_admin, make_consumer
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import describe_pipeline, durability_warnings, pipeline_topics, provision_pipeline

from ..runtime.conftest import wait_until

pytestmark = pytest.mark.broker


def test_the_cluster_elects_a_controller_and_survives_its_kill(
    cluster: KafkaCluster, unique_name: Callable[[str], str]
) -> None:
    kafka = cluster.kafka_config()
    admin = make_admin(kafka)
    assert sorted(b.id for b in admin.list_topics(timeout=10).brokers.values()) == [1, 2, 3]
    controller = wait_until(cluster.active_controller, 30, "an active controller")
    topic = unique_name("survivor")
    ensure_topics(admin, [TopicSpec(name=topic, partitions=3)])
    # a new topic reaches every broker's metadata a moment after the controller created it
    durability = wait_until(lambda: topic_durability(admin, [topic]).get(topic), 30, "the topic in the metadata")
    assert (durability.replication_factor, durability.min_insync_replicas) == (3, 2)

    # when: the active controller is SIGKILLed
    cluster.kill(controller)
    successor = wait_until(
        lambda: (c := cluster.active_controller()) not in (None, controller) and c,
        30,
        "another node to become the active controller",
    )

    # then: acks=all writes succeed on the two nodes left, and every record reads back
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all", "enable.idempotence": True})
    failures: list[object] = []
    for i in range(300):
        producer.produce(
            topic, value=str(i).encode(), partition=i % 3, on_delivery=lambda err, _m: err and failures.append(err)
        )
    assert producer.flush(60) == 0 and not failures, failures
    cluster.restart(controller)
    cluster.await_brokers(3)
    cluster.await_in_sync([topic])
    consumer = make_consumer(kafka, group_id=unique_name("reader"))
    consumer.subscribe([topic])
    seen: set[int] = set()
    try:
        wait_until(
            lambda: (
                seen.update(int(m.value()) for m in consumer.consume(500, 0.5) if not m.error()) or len(seen) == 300
            ),
            60,
            "every record written with a node down",
        )
    finally:
        consumer.close()
    assert successor != controller and seen == set(range(300))


def test_provisioning_sets_replication_and_warns_of_a_less_durable_tier(
    cluster: KafkaCluster, unique_name: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    kafka = cluster.kafka_config()
    source, group = unique_name("orders"), unique_name("billing")
    pipeline = AppSettings(
        topic=source, group=group, delays=("1s", "5s"), partitions=2, replication_factor=3, min_insync_replicas=3
    )
    provision_pipeline(kafka, pipeline, create_source=True)
    every = [source, *pipeline_topics(pipeline).all_topics]
    admin = make_admin(kafka)
    wait_until(lambda: len(topic_durability(admin, every)) == len(every), 30, "every topic in the metadata")
    rows = describe_pipeline(kafka, pipeline)
    assert {(r.replicas, r.in_sync_replicas, r.min_insync_replicas) for r in rows} == {(3, 3, 3)}
    assert len(rows) == 4 * 2 and durability_warnings(kafka, pipeline) == []

    # an app provisioning its tiers with fewer copies and weaker acks than its source is told so
    app = RetryApp(kafka=kafka, group=unique_name("weak"))
    app.handler(source)(lambda record: None)
    with caplog.at_level(logging.WARNING, logger="retrytopics.app"):
        app.provision(replication_factor=2, min_insync_replicas=1)
    tiers = app.topics(source).all_topics
    durability = topic_durability(make_admin(kafka), tiers)
    assert {(d.replication_factor, d.min_insync_replicas) for d in durability.values()} == {(2, 1)}
    warned = [r.getMessage() for r in caplog.records if r.name == "retrytopics.app"]
    for tier in tiers:
        assert any(f"{tier} has replication factor 2, less than its source {source} (3)" in w for w in warned), warned
        assert any(f"{tier} has min.insync.replicas=1" in w for w in warned), warned


def test_a_partition_leader_killed_mid_run_loses_nothing_at_least_once(
    cluster: KafkaCluster, drill: ModuleType, unique_name: Callable[[str], str]
) -> None:
    outcome = drill.run_drill(cluster, drill.DrillPlan(), drill.kill_partition_leader(), name=unique_name)
    print(outcome.summary())

    assert outcome.lost == [], "records neither handled nor dead-lettered"
    assert outcome.early == [], "handled before their due time"
    assert outcome.duplicate_dead_letters == {}, "dead-lettered more than once"
    assert outcome.unplanned_dead_letters == [], "dead-lettered although they were to succeed"
    assert outcome.uncommitted == [], "consumers that never committed to the end of their partitions"
