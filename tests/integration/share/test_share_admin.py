"""Share-group administration through `connectors.admin` on Apache Kafka 4.4.0, and what confluent-kafka
2.16's admin client cannot do for share groups yet (docs/share-groups.md)."""

from __future__ import annotations

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupType

from retrytopics.connectors.admin import ShareGroupConfig, set_share_group_config, share_group_config
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.ports import AckType

from .conftest import ShareKit, deliveries_until

pytestmark = pytest.mark.broker


def test_share_group_configs_are_set_and_read_back(share: ShareKit) -> None:
    """`set_share_group_config` sets a group's configs before any member joined, incrementally (a later
    call leaves the others), and `share_group_config` reads them back with the broker's defaults."""
    group = share.group
    assert share_group_config(share.admin, group)["share.auto.offset.reset"] == "latest"  # Kafka's default
    set_share_group_config(
        share.admin, group, ShareGroupConfig(auto_offset_reset="earliest", record_lock_duration_ms=15_000)
    )
    set_share_group_config(share.admin, group, ShareGroupConfig(delivery_count_limit=3, dlq_copy_record=True))
    config = share_group_config(share.admin, group)
    assert config["share.auto.offset.reset"] == "earliest"
    assert config["share.record.lock.duration.ms"] == "15000"
    assert config["share.delivery.count.limit"] == "3"
    assert config["errors.deadletterqueue.copy.record.enable"] == "true"
    assert config["errors.deadletterqueue.topic.name"] == ""


def test_an_out_of_range_setting_is_refused_naming_it(share: ShareKit) -> None:
    """The broker bounds the delivery count limit (2-10): the whole change is refused, naming the setting,
    and nothing of it is applied."""
    with pytest.raises(KafkaClientError) as refused:
        set_share_group_config(
            share.admin, share.group, ShareGroupConfig(auto_offset_reset="earliest", delivery_count_limit=11)
        )
    assert refused.value.code == "INVALID_CONFIG"
    assert "share.delivery.count.limit" in str(refused.value)
    assert share_group_config(share.admin, share.group)["share.auto.offset.reset"] == "latest"


def test_the_client_cannot_describe_a_share_group(share: ShareKit) -> None:
    """confluent-kafka 2.16 has no describe_share_groups (Kafka's DescribeShareGroups, KIP-932): its
    describe_consumer_groups answers a live share group, with a member holding records, as a dead classic
    group with no members, and ConsumerGroupType has no SHARE. When this fails, the client has learnt to
    describe share groups: use it for `topics describe`."""
    share.setup(2)
    consumer = share.consumer()
    deliveries_until([consumer], lambda _m: AckType.ACCEPT, lambda s: len(s) >= 2, 20)
    assert "SHARE" not in ConsumerGroupType.__members__
    assert not hasattr(share.admin, "describe_share_groups")
    description = share.admin.describe_consumer_groups([share.group])[share.group].result(timeout=10)
    assert description.members == []
    assert description.state == ConsumerGroupState.DEAD
    assert description.type == ConsumerGroupType.CLASSIC
