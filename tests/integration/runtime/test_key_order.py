"""Key-ordered retries on Apache Kafka (docs/key-ordering.md).

Guarantee (provisioning): a key-ordered handler's key-state topic is created by `provision()` and by
`topics create` (`provision_pipeline`) as the design needs it: compacted (it must hold the live state only,
one record per key), with the source's partition count (the state of source partition p is in partition p),
idempotently; a handler without ordering gets none.

Guarantee (reading at assignment): `read_to_end` on Apache Kafka gives every key-state record of the partitions
asked for, in log order (what `SourceChains.rebuild` needs: a later record of a key wins), skipping nothing the
memory broker would give and including an empty partition; a topic that does not exist is a
`KafkaClientError`, never an empty state.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from retrytopics import KeyOrdering, RetryApp, RetryPolicy
from retrytopics.client_factory import KafkaClientFactory
from retrytopics.connectors.admin import ProvisionOutcome
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.key_order import Chain, ChainKey, Closed, Fate, Passage, SourceChains, encode_record, key_id
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import provision_pipeline
from retrytopics.runtime.records.key_state import read_key_state

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


def test_the_key_state_is_read_to_its_end_in_log_order(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str]
) -> None:
    # setup: an ordered handler's key-state topic (3 partitions) holding a chain that moved, a closed chain,
    # a malformed record, and nothing in partition 2
    source = kit.create(unique_name("orders"), 3)
    app = RetryApp(kafka=kafka, group=unique_name("billing"))
    app.handler(source, policy=RetryPolicy(delays=["5s", "1m"]), ordering=KeyOrdering())(lambda record: None)
    app.provision()
    topic = app.topics(source).key_state_topic
    a, b = ChainKey(source, 0, key_id(b"acct-1")), ChainKey(source, 1, key_id(b"acct-2"))
    written = [
        Chain(chain=a, head=4, frontier=4, at_tier=0, followers=0, since_ms=1),
        Chain(chain=b, head=2, frontier=2, at_tier=0, followers=0, since_ms=1),
        Chain(chain=a, head=4, frontier=9, at_tier=0, followers=1, since_ms=1),
        Passage(tier=0, chain=a, seen=9, fate=Fate.SENT, to_tier=1, after=9),
        Closed(chain=b),
    ]
    for record in written:
        key, value, partition = encode_record(record)
        kit.produce(topic, [(key, value, [])], partition=partition)
    kit.produce(topic, [(b"chain/x", b"{}", [])], partition=1)

    # when: a main consumer of source partitions 0 and 2, and a tier consumer, read it
    clients = KafkaClientFactory(kafka)
    mine = read_key_state(clients.read_to_end, topic, [0, 2], timeout_s=30)
    every = read_key_state(clients.read_to_end, topic, None, timeout_s=30)

    # then: log order per partition, the malformed record counted, the moved chain's followers go to tier 1
    assert mine.records == (written[0], written[2], written[3]) and mine.malformed == 0
    assert sorted(every.records, key=repr) == sorted(written, key=repr) and every.malformed == 1
    chains, _ = SourceChains.rebuild(KeyOrdering(), mine.records, source=source, partition=0)
    admission = chains.admit(key_id(b"acct-1"))
    assert (admission.tier, admission.after) == (1, 9)
    with pytest.raises(KafkaClientError):
        clients.read_to_end(unique_name("absent"), None, 5)
