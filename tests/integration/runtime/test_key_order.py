"""Key-ordered retries on Apache Kafka (docs/key-ordering.md).

Guarantee (provisioning): a key-ordered handler's key-state topic is created by `provision()` and by
`topics create` (`provision_pipeline`) as the design needs it: compacted (it must hold the live state only,
one record per key), with the source's partition count (the state of source partition p is in partition p),
idempotently; a handler without ordering gets none.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from retrytopics import KeyOrdering, RetryApp, RetryPolicy
from retrytopics.connectors.admin import ProvisionOutcome
from retrytopics.connectors.config import KafkaConfig
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import provision_pipeline

from .conftest import Kit

pytestmark = pytest.mark.broker


def _cleanup_policy(kit: Kit, topic: str) -> str:
    [future] = kit.admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return str(future.result(timeout=30)["cleanup.policy"].value)


def _partitions(kit: Kit, topic: str) -> int:
    return len(kit.admin.list_topics(topic, timeout=10).topics[topic].partitions)


def test_provision_and_topics_create_make_a_compacted_key_state_topic(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str]
) -> None:
    # setup: an ordered and an unordered source of 3 partitions
    ordered, unordered = kit.create(unique_name("orders"), 3), kit.create(unique_name("refunds"), 3)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group)
    app.handler(ordered, policy=RetryPolicy(delays=["5s"]), ordering=KeyOrdering())(lambda record: None)
    app.handler(unordered, policy=RetryPolicy(delays=["5s"]))(lambda record: None)
    keys = app.topics(ordered).key_state_topic

    # when: provisioned twice
    first, second = app.provision(), app.provision()

    # then: the key-state topic of the ordered handler only, compacted, as many partitions as its source
    assert first[keys] is ProvisionOutcome.CREATED and second[keys] is ProvisionOutcome.EXISTS
    assert [name for name in first if name.endswith(".keys")] == [keys]
    assert _cleanup_policy(kit, keys) == "compact"
    assert _partitions(kit, keys) == 3
    assert _cleanup_policy(kit, app.topics(ordered).dlq) == "delete", "the tiers and DLQ keep their retention"

    # when: `topics create` for another group's ordered pipeline of the same source
    other = unique_name("audit")
    outcome = provision_pipeline(
        kafka, AppSettings(topic=ordered, group=other, delays=("5s",), key_ordering=True, replication_factor=1)
    )

    # then: its own compacted key-state topic, named like its tiers
    assert outcome[f"{ordered}.{other}.keys"] is ProvisionOutcome.CREATED
    assert _cleanup_policy(kit, f"{ordered}.{other}.keys") == "compact"
    assert _partitions(kit, f"{ordered}.{other}.keys") == 3
