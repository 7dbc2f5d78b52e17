"""Where a `RetryApp` gets its clients: Kafka by default (`KafkaClientFactory`), or whatever `ClientFactory` the
app is given (`RetryApp(clients=...)`; `retrytopics.testing.MemoryClientFactory` runs an app on the in-memory
broker).

Everything the app does with a broker goes through one `ClientFactory`: each consumer loop's consumer and
producer, the tail reads that seed the hand-off audit (runtime/records/duplicates.py), and `provision()`. The runtime
itself only ever sees the ports (`retrytopics.core.ports`).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from retrytopics.connectors.admin import (
    AdminEndOffsets,
    ProvisionOutcome,
    ShareGroupConfig,
    TopicDurability,
    TopicSpec,
    ensure_topics,
    partition_count,
    set_share_group_config,
    share_group_config,
    topic_durability,
)
from retrytopics.connectors.clients import KafkaConsumer, KafkaProducer, KeyStateFeed, read_tails, read_to_end
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin
from retrytopics.connectors.share import KafkaShareConsumer
from retrytopics.core.ports import ConsumerPort, EndOffsetsPort, Message, ProducerPort, ShareConsumerPort
from retrytopics.core.transactions import CALL_TIMEOUT_MS
from retrytopics.runtime.clock import SYSTEM_CLOCK, Clock
from retrytopics.runtime.keyorder.ordering import KeyStateFeed as KeyStateFeedPort

__all__ = ["ClientFactory", "KafkaClientFactory"]


def __getattr__(name: str) -> Any:
    # `MemoryClientFactory` moved to `retrytopics.testing` with the in-memory broker; imported lazily, so that the
    # product never loads its test fakes unless asked
    if name == "MemoryClientFactory":
        warnings.warn(
            "retrytopics.client_factory.MemoryClientFactory moved: import it from retrytopics.testing",
            DeprecationWarning,
            stacklevel=2,
        )
        from retrytopics.testing.clients import MemoryClientFactory

        return MemoryClientFactory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ClientFactory(Protocol):
    """What a `RetryApp` asks of a broker. `overrides` are librdkafka properties (the app's own, over the
    tier consumers' defaults); a factory applies those it understands. `clock`: the time every consumer
    of the app reads (runtime/clock.py)."""

    clock: Clock

    def consumer(self, group_id: str, overrides: Mapping[str, Any]) -> ConsumerPort:
        """A member of `group_id` for one consumer loop, manual commits, read_committed unless overridden."""

    def producer(self, transactional_id: str | None, overrides: Mapping[str, Any]) -> ProducerPort:
        """An idempotent producer; transactional (the loop initialises it) when `transactional_id` is given."""

    def share_consumer(self, group_id: str, overrides: Mapping[str, Any]) -> ShareConsumerPort:
        """A member of share group `group_id`, acknowledging explicitly (`RetryApp(consumer="share")`)."""

    def share_group_config(self, group_id: str, timeout_s: float) -> dict[str, str]:
        """The share group's configs by Kafka's names (`share.delivery.count.limit`, ...), defaults included."""

    def set_share_group_config(self, group_id: str, config: ShareGroupConfig, timeout_s: float) -> None:
        """Set the share group's configs (those `config` names; the others stay)."""

    def read_tails(self, topics: Sequence[str], last: int, timeout_s: float) -> list[Message]:
        """The last `last` records of every partition of `topics`, read_committed and without a group, read
        within `timeout_s`; a topic that does not exist is skipped."""

    def read_to_end(self, topic: str, partitions: Sequence[int] | None, timeout_s: float) -> list[Message]:
        """Every record of `topic`'s `partitions` (None: all) up to their end now, read_committed and without a
        group, in log order per partition; anything short of that (a missing topic or partition, a failed read,
        `timeout_s` passed) is a `KafkaClientError`."""

    def key_state_feed(self) -> KeyStateFeedPort:
        """An assign()-only, read_committed reader of key-state partitions as they grow (key order's passages,
        read every poll by a main consumer of key-ordered handlers)."""

    def partition_count(self, topic: str, timeout_s: float) -> int | None:
        """Partitions of `topic`, or None when it does not exist."""

    def end_offsets(self) -> EndOffsetsPort:
        """Asks end offsets without waiting (a consumer's lag while its partitions are paused: runtime/lag.py)."""

    def ensure_topics(self, specs: Sequence[TopicSpec], timeout_s: float) -> dict[str, ProvisionOutcome]:
        """Create the missing topics; an existing one with another partition count is a `TopicMismatchError`."""

    def topic_durability(self, topics: Sequence[str], timeout_s: float) -> dict[str, TopicDurability]:
        """Replication factor and effective min.insync.replicas of each existing topic of `topics`."""


class KafkaClientFactory:
    """The default: confluent-kafka clients for `kafka` (connectors/clients.py), every product default
    applied (idempotence, acks=all, manual commits, read_committed)."""

    clock: Clock = SYSTEM_CLOCK

    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self._admin: Any = None  # confluent-kafka's AdminClient (only connectors/ names its types); on first use
        self._admin_lock = threading.Lock()  # each consumer thread asks it for its end offsets (runtime/lag.py)

    def consumer(self, group_id: str, overrides: Mapping[str, Any]) -> ConsumerPort:
        return KafkaConsumer(self.kafka, group_id=group_id, overrides=overrides)

    def producer(self, transactional_id: str | None, overrides: Mapping[str, Any]) -> ProducerPort:
        # a topic's partition count is asked for in the loop, on a hand-off's first publish to it
        return KafkaProducer(
            self.kafka,
            transactional_id=transactional_id,
            overrides=overrides,
            metadata_timeout_s=CALL_TIMEOUT_MS / 1000,
        )

    def share_consumer(self, group_id: str, overrides: Mapping[str, Any]) -> ShareConsumerPort:
        return KafkaShareConsumer(self.kafka, group_id=group_id, overrides=overrides)

    def share_group_config(self, group_id: str, timeout_s: float) -> dict[str, str]:
        return share_group_config(self._admin_client(), group_id, timeout_s=timeout_s)

    def set_share_group_config(self, group_id: str, config: ShareGroupConfig, timeout_s: float) -> None:
        set_share_group_config(self._admin_client(), group_id, config, timeout_s=timeout_s)

    def read_tails(self, topics: Sequence[str], last: int, timeout_s: float) -> list[Message]:
        return read_tails(self.kafka, topics, last=last, timeout_s=timeout_s)

    def read_to_end(self, topic: str, partitions: Sequence[int] | None, timeout_s: float) -> list[Message]:
        return read_to_end(self.kafka, topic, partitions, timeout_s=timeout_s)

    def key_state_feed(self) -> KeyStateFeedPort:
        return KeyStateFeed(self.kafka)

    def partition_count(self, topic: str, timeout_s: float) -> int | None:
        return partition_count(self._admin_client(), topic, timeout_s=timeout_s)

    def end_offsets(self) -> EndOffsetsPort:
        return AdminEndOffsets(self._admin_client())

    def ensure_topics(self, specs: Sequence[TopicSpec], timeout_s: float) -> dict[str, ProvisionOutcome]:
        return ensure_topics(self._admin_client(), specs, timeout_s=timeout_s)

    def topic_durability(self, topics: Sequence[str], timeout_s: float) -> dict[str, TopicDurability]:
        return topic_durability(self._admin_client(), topics, timeout_s=timeout_s)

    def _admin_client(self) -> Any:
        with self._admin_lock:
            if self._admin is None:
                self._admin = make_admin(self.kafka)
            return self._admin
