"""Provisioning a share group's broker DLQ (KIP-1191) with `topics create` and `RetryApp.provision()` on
Apache Kafka 4.4.0: the `dlq.<group>` topic, the group configs naming it, idempotence, the opt-out, and the
broker writing there once it is set (docs/operations.md, "The broker's DLQ of a share group")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

from retrytopics import RetryApp
from retrytopics.connectors.admin import TopicSpec, ensure_topics, partition_count, share_group_config
from retrytopics.connectors.kafka import make_producer
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import AckType
from retrytopics.core.record import Record

from .conftest import ShareKit, deliveries_until, read_topic

pytestmark = pytest.mark.broker
CLI = str(Path(sys.executable).with_name("retrytopics"))


def _topics_create(share: ShareKit, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RETRYTOPICS_APP_CONSUMER": "share"}
    args = ["topics", "create", "--bootstrap", share.kafka.bootstrap, "--topic", share.topic, "--group", share.group]
    return subprocess.run(
        [CLI, *args, "--delays", "1s", *flags], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def _dlq_enabled(share: ShareKit, topic: str) -> str:
    [future] = share.admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return str(future.result(30)["errors.deadletterqueue.group.enable"].value)


def test_topics_create_sets_the_broker_dlq_of_a_share_pipeline_idempotently(share: ShareKit) -> None:
    """`topics create` of a share-group pipeline creates `dlq.<group>` with
    `errors.deadletterqueue.group.enable=true` and sets the group's `errors.deadletterqueue.topic.name` to it
    with record copies and `share.auto.offset.reset=earliest`; run again, it changes nothing."""
    ensure_topics(share.admin, [TopicSpec(name=share.topic, partitions=2)])
    dlq = f"dlq.{share.group}"
    first = _topics_create(share)
    assert first.returncode == 0, first.stderr
    assert f"created  {dlq}" in first.stdout.splitlines()
    again = _topics_create(share)
    assert again.returncode == 0, again.stderr
    assert f"exists   {dlq}" in again.stdout.splitlines()
    assert not [line for line in again.stdout.splitlines() if line.startswith("created")]
    assert partition_count(share.admin, dlq) == 1
    assert _dlq_enabled(share, dlq) == "true"
    config = share_group_config(share.admin, share.group)
    assert config["errors.deadletterqueue.topic.name"] == dlq
    assert config["errors.deadletterqueue.copy.record.enable"] == "true"
    assert config["share.auto.offset.reset"] == "earliest"


def test_topics_create_without_the_broker_dlq_leaves_it_unset(share: ShareKit) -> None:
    """`--no-broker-dlq`: no `dlq.<group>` topic and no group DLQ config; the group still starts earliest."""
    ensure_topics(share.admin, [TopicSpec(name=share.topic)])
    done = _topics_create(share, "--no-broker-dlq")
    assert done.returncode == 0, done.stderr
    assert partition_count(share.admin, f"dlq.{share.group}") is None
    config = share_group_config(share.admin, share.group)
    assert config["errors.deadletterqueue.topic.name"] == ""
    assert config["share.auto.offset.reset"] == "earliest"


def test_a_provisioned_share_app_has_the_broker_dead_letter_what_its_members_reject(
    share: ShareKit, unique_name: Callable[[str], str]
) -> None:
    """`RetryApp(consumer="share").provision()` sets the broker DLQ consistently: a record a member of the
    app's group rejects (as a process that cannot dead-letter it would leave it) reaches `dlq.<group>` with
    its key, value and `__dlq.errors.*` headers. `provision(broker_dlq=False)` of another app sets none."""
    ensure_topics(share.admin, [TopicSpec(name=share.topic)])
    app = RetryApp(kafka=share.kafka, group=share.group, consumer="share")

    @app.handler(share.topic, policy=RetryPolicy(delays=("1s",)))
    def handle(record: Record[bytes]) -> None:  # never called: provisioning only
        raise AssertionError(record)

    dlq = f"dlq.{share.group}"
    assert app.provision()[dlq].value == "created"
    assert app.provision()[dlq].value == "exists"
    producer = make_producer(share.kafka)
    producer.produce(share.topic, key=b"k-0", value=b"v-0", headers=[("origin", b"test")])
    assert producer.flush(30) == 0
    consumer = share.consumer()
    seen = deliveries_until([consumer], lambda m: AckType.REJECT, lambda s: len(s) >= 1, 20)
    assert [m.value for m in seen] == [b"v-0"]
    [(key, value, headers)] = read_topic(share.kafka, dlq, 1)
    assert (key, value) == (b"k-0", b"v-0")
    found = dict(headers)
    assert found["__dlq.errors.topic"] == share.topic.encode()
    assert found["__dlq.errors.group"] == share.group.encode()
    assert found["__dlq.errors.message"] == b"Offset rejected by client."
    assert "origin" not in found

    other = RetryApp(kafka=share.kafka, group=unique_name("share-group"), consumer="share")
    other.handler(share.topic, policy=RetryPolicy(delays=("1s",)))(handle)
    assert not [t for t in other.provision(broker_dlq=False) if t.startswith("dlq.")]
    assert share_group_config(share.admin, other.group)["errors.deadletterqueue.topic.name"] == ""


def test_topics_describe_of_a_share_pipeline_shows_the_groups_settings_and_no_source_lag(share: ShareKit) -> None:
    """`topics describe` of a share-group pipeline: the source has no committed position or lag (a share group
    commits none; its state reads `share group`), and the group's settings as the broker applies them follow the
    table (delivery count limit, record lock, the broker DLQ `topics create` set), with the one line saying
    what this client cannot describe (members, in-flight and acquired records). `--json` carries the same."""
    ensure_topics(share.admin, [TopicSpec(name=share.topic, partitions=2)])
    assert _topics_create(share).returncode == 0
    env = {**os.environ, "RETRYTOPICS_APP_CONSUMER": "share"}
    args = ["topics", "describe", "--bootstrap", share.kafka.bootstrap, "--topic", share.topic, "--group", share.group]
    shown = subprocess.run(
        [CLI, *args, "--delays", "1s"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert shown.returncode == 0, shown.stderr
    source_rows = [line for line in shown.stdout.splitlines() if line.startswith(share.topic + " ")]
    assert len(source_rows) == 2 and all("share group" in row for row in source_rows)
    assert f"share group {share.group}:" in shown.stdout
    assert f"  errors.deadletterqueue.topic.name = dlq.{share.group}" in shown.stdout.splitlines()
    assert any(line.startswith("  share.delivery.count.limit = ") for line in shown.stdout.splitlines())
    assert "cannot describe share groups" in shown.stdout
    as_json = subprocess.run(
        [CLI, *args, "--delays", "1s", "--json"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert as_json.returncode == 0, as_json.stderr
    described = json.loads(as_json.stdout)
    sources = [row for row in described["partitions"] if row["kind"] == "source"]
    assert [row["lag"] for row in sources] == [None, None]
    assert described["share_group"]["configs"]["errors.deadletterqueue.topic.name"] == f"dlq.{share.group}"
