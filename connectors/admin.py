"""Topic provisioning: create what is missing, accept what already matches, refuse what differs."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from retrytopics.connectors.config import check_replication
from retrytopics.connectors.kafka import map_kafka_errors
from retrytopics.core.broker_dlq import broker_dlq_topic
from retrytopics.core.errors import ConfigError, KafkaClientError, TopicMismatchError
from retrytopics.core.naming import TopicSet

__all__ = [
    "SHARE_DLQ_TOPIC_CONFIG",
    "ProvisionOutcome",
    "ShareGroupConfig",
    "TopicDurability",
    "TopicSpec",
    "committed_offsets",
    "end_offsets",
    "ensure_topics",
    "key_state_problem",
    "key_state_spec",
    "less_durable",
    "partition_count",
    "read_at",
    "replication_config",
    "set_share_group_config",
    "share_group_config",
    "share_group_provisioning",
    "topic_durability",
]


class ProvisionOutcome(StrEnum):
    """What `ensure_topics` did for one topic."""

    CREATED = "created"
    """The topic did not exist and was created."""
    EXISTS = "exists"
    """The topic existed with the partition count asked for; nothing was changed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicSpec:
    """A topic as provisioning should leave it. `replication_factor=-1` means the broker's default."""

    name: str
    partitions: int = 1
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("name", self.name, "a topic name is required")
        if self.partitions < 1:
            raise ConfigError(f"{self.name}.partitions", self.partitions, "must be at least 1")
        check_replication(self.replication_factor, None, field=self.name)
        object.__setattr__(self, "config", MappingProxyType({k: str(v) for k, v in self.config.items()}))
        if "min.insync.replicas" in self.config:
            check_replication(self.replication_factor, self.config["min.insync.replicas"], field=self.name)


def replication_config(min_insync_replicas: int | None) -> dict[str, str]:
    """The topic config that carries `min.insync.replicas` (none: the broker's default applies)."""
    return {} if min_insync_replicas is None else {"min.insync.replicas": str(min_insync_replicas)}


def key_state_spec(topics: TopicSet, partitions: int, replication_factor: int, config: Mapping[str, str]) -> TopicSpec:
    """The key-state topic of a key-ordered handler (docs/key-ordering.md, section 5): compacted, so it holds
    the live state only (one record per open chain and per remembered record); as many partitions as the
    source, since the state of source partition p is written to partition p; the tiers' replication."""
    return TopicSpec(
        name=topics.key_state_topic,
        partitions=partitions,
        replication_factor=replication_factor,
        config={**config, "cleanup.policy": "compact"},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicDurability:
    """How durable a topic's writes are: replicas per partition (the fewest of any partition) and the
    `min.insync.replicas` an acks=all write needs (the topic's, else the broker's default; None when the
    broker does not say, as tansu does not); and what it keeps, its `cleanup.policy` (None: not said)."""

    replication_factor: int
    min_insync_replicas: int | None
    cleanup_policy: str | None = None


def key_state_problem(
    topics: TopicSet, source_partitions: int, found: TopicDurability | None, partitions: int | None
) -> str | None:
    """Why a key-ordered handler cannot start on the key-state topic of `topics` as found (`found` and its
    `partitions`, None when it does not exist), or None. It must exist, keep records by key only
    (`cleanup.policy=compact`: with `delete` the chain record of a key blocked longer than `retention.ms`
    would vanish and its followers run out of order), and have a partition for every source partition (the
    state of source partition p is written to partition p). A policy the broker does not say is not refused."""
    name = topics.key_state_topic
    fix = "create it with `retrytopics topics create` or `app.provision()`"
    if found is None or partitions is None:
        return f"the key-state topic {name!r} of the key-ordered handler of {topics.source!r} does not exist: {fix}"
    if found.cleanup_policy is not None and found.cleanup_policy.replace(" ", "") != "compact":
        return (
            f"the key-state topic {name!r} has cleanup.policy={found.cleanup_policy}, not compact: records of keys "
            f"blocked longer than its retention would be deleted; set cleanup.policy=compact on it "
            f"(kafka-configs --alter), or delete it and {fix}"
        )
    if partitions < source_partitions:
        return (
            f"the key-state topic {name!r} has {partitions} partitions, the source {topics.source!r} "
            f"{source_partitions}: add partitions to it (the state of source partition p lives in partition p)"
        )
    return None


def less_durable(source: str, durability: Mapping[str, TopicDurability]) -> list[str]:
    """One warning per topic of `durability` that keeps fewer copies than `source`, or acknowledges a write
    with fewer: a record handed off from the source to such a tier or DLQ is more easily lost than it was."""
    if source not in durability:
        return []
    own = durability[source]
    warnings = []
    for name, other in durability.items():
        if name == source:
            continue
        if other.replication_factor < own.replication_factor:
            warnings.append(
                f"{name} has replication factor {other.replication_factor}, less than its source "
                f"{source} ({own.replication_factor}): a record handed off there is less durable"
            )
        mine, theirs = own.min_insync_replicas, other.min_insync_replicas
        if mine is not None and theirs is not None and theirs < mine:
            warnings.append(
                f"{name} has min.insync.replicas={other.min_insync_replicas}, less than its source "
                f"{source} ({own.min_insync_replicas}): an acks=all hand-off there needs fewer copies"
            )
    return warnings


def topic_durability(
    admin: AdminClient, names: Sequence[str], *, timeout_s: float = 10.0
) -> dict[str, TopicDurability]:
    """Replication factor and effective `min.insync.replicas` of each existing topic of `names`."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    with map_kafka_errors():
        metadata = admin.list_topics(timeout=timeout_s).topics
    found = [n for n in names if n in metadata and metadata[n].error is None and metadata[n].partitions]
    if not found:
        return {}
    replicas = {n: min(len(p.replicas) for p in metadata[n].partitions.values()) for n in found}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answers = admin.describe_configs(
                [ConfigResource(ResourceType.TOPIC, n) for n in found], request_timeout=timeout_s
            )
            return {
                resource.name: _durability(replicas[resource.name], future.result(timeout_s))
                for resource, future in answers.items()
            }
        except KafkaException as exc:
            # on a cluster, the broker asked may not know a topic created a moment ago through another one
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                with map_kafka_errors():
                    raise
            time.sleep(0.1)


def _durability(replication_factor: int, entries: Mapping[str, object]) -> TopicDurability:
    policy = getattr(entries.get("cleanup.policy"), "value", None)
    return TopicDurability(
        replication_factor=replication_factor,
        min_insync_replicas=_min_insync(entries),
        cleanup_policy=policy if isinstance(policy, str) else None,
    )


def _min_insync(entries: Mapping[str, object]) -> int | None:
    entry = entries.get("min.insync.replicas")
    value = getattr(entry, "value", None)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _existing_partitions(admin: AdminClient, names: Sequence[str], timeout_s: float) -> dict[str, int]:
    with map_kafka_errors(admin):
        metadata = admin.list_topics(timeout=timeout_s)
    return {
        name: len(meta.partitions)
        for name, meta in metadata.topics.items()
        if name in names and meta.error is None and meta.partitions
    }


def partition_count(admin: AdminClient, topic: str, *, timeout_s: float = 10.0) -> int | None:
    """Partitions of `topic`, or None when it does not exist."""
    return _existing_partitions(admin, [topic], timeout_s).get(topic)


def _check(spec: TopicSpec, actual: int) -> None:
    if actual != spec.partitions:
        raise TopicMismatchError(spec.name, spec.partitions, actual)


def _create(admin: AdminClient, missing: Sequence[TopicSpec], timeout_s: float) -> set[str]:
    """Create topics; returns the names another client created first (a race, not an error)."""
    new = [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.config)) for s in missing]
    raced: set[str] = set()
    for name, future in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args and exc.args[0].name() == "TOPIC_ALREADY_EXISTS":
                raced.add(name)
                continue
            with map_kafka_errors(admin):
                raise
    return raced


def ensure_topics(
    admin: AdminClient, specs: Sequence[TopicSpec], *, timeout_s: float = 30.0
) -> dict[str, ProvisionOutcome]:
    """Create missing topics and verify existing ones. Idempotent.

    Raises `TopicMismatchError` (naming the topic and both counts) when an existing topic's partition count
    differs from its spec: changing it would move keys between partitions, so that is an operator's decision.
    """
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError("topics", names, "a topic is listed twice")
    existing = _existing_partitions(admin, names, timeout_s)
    for spec in specs:
        if spec.name in existing:
            _check(spec, existing[spec.name])
    missing = [s for s in specs if s.name not in existing]
    raced = _create(admin, missing, timeout_s) if missing else set()
    _wait_visible(admin, list(missing), timeout_s)
    outcome = {s.name: ProvisionOutcome.EXISTS for s in specs if s.name in existing or s.name in raced}
    outcome.update({s.name: ProvisionOutcome.CREATED for s in missing if s.name not in raced})
    return outcome


def _wait_visible(admin: AdminClient, specs: Sequence[TopicSpec], timeout_s: float) -> None:
    # Topic creation propagates asynchronously on a real cluster; clients that start right away must
    # see every partition, or they would start with a partial assignment.
    deadline = time.monotonic() + timeout_s
    names = [s.name for s in specs]
    while names:
        seen = _existing_partitions(admin, names, timeout_s)
        for spec in specs:
            if spec.name in seen:
                _check(spec, seen[spec.name])
        names = [n for n in names if n not in seen]
        if not names:
            return
        if time.monotonic() > deadline:
            raise KafkaClientError(f"topics not visible after {timeout_s}s: {names}", code="TIMED_OUT")
        time.sleep(0.05)


def end_offsets(admin_or_consumer: object, topic: str, partitions: int, *, timeout_s: float = 10.0) -> dict[int, int]:
    """High watermarks per partition, read from the broker (never from a cache)."""
    consumer = admin_or_consumer
    result: dict[int, int] = {}
    with map_kafka_errors():
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(  # type: ignore[attr-defined]
                TopicPartition(topic, p), timeout=timeout_s, cached=False
            )
            result[p] = high
    return result


class ListedEndOffsets:
    """One ListOffsets request in flight (`list_end_offsets`); `done()` never waits."""

    def __init__(self, futures: Mapping[TopicPartition, Any]) -> None:
        self._futures = futures

    def done(self) -> bool:
        return all(future.done() for future in self._futures.values())

    def result(self) -> dict[tuple[str, int], int]:
        with map_kafka_errors():
            return {(tp.topic, tp.partition): future.result().offset for tp, future in self._futures.items()}


class AdminEndOffsets:
    """End offsets through an admin client: one batched, asynchronous ListOffsets per `request`
    (`core.ports.EndOffsetsPort`), read_committed (the last stable offset)."""

    def __init__(self, admin: AdminClient, *, timeout_s: float = 10.0) -> None:
        self._admin = admin
        self._timeout_s = timeout_s

    def request(self, tps: Sequence[tuple[str, int]]) -> ListedEndOffsets:
        with map_kafka_errors():
            futures = self._admin.list_offsets(
                {TopicPartition(topic, partition): OffsetSpec.latest() for topic, partition in tps},  # type: ignore[no-untyped-call]
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self._timeout_s,
            )
        return ListedEndOffsets(futures)


def committed_offsets(
    kafka: object, group: str, topic: str, partitions: int, *, timeout_s: float = 10.0
) -> dict[int, int | None]:
    """The group's committed offset per partition (None where it never committed). Reads only; the
    consumer used for the query never subscribes, so it never joins or disturbs the group."""
    from retrytopics.connectors.kafka import make_consumer

    consumer = make_consumer(kafka, group_id=group)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                with map_kafka_errors():
                    answer = consumer.committed(
                        [TopicPartition(topic, p) for p in range(partitions)],
                        timeout=max(0.1, deadline - time.monotonic()),
                    )
                return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in answer}
            except KafkaClientError as exc:
                # the group's coordinator is moving or loading (a group new to the broker, a restart):
                # librdkafka fails the fetch rather than finding the coordinator again, so ask again
                if exc.code not in _COORDINATOR_MOVING or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
    finally:
        consumer.close()


_COORDINATOR_MOVING = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"})


def read_at(kafka: object, topic: str, partition: int, offset: int, *, timeout_s: float = 5.0) -> object | None:
    """The record at `offset` of one partition (or None if it is not there within the timeout)."""
    from retrytopics.connectors.kafka import make_consumer

    consumer = make_consumer(kafka, group_id=None)  # type: ignore[arg-type]
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                return message
        return None
    finally:
        consumer.close()


#: What a topic needs before a broker (4.4+, KIP-1191) writes a share group's dead letters to it. Its name must
#: also start with the broker's `errors.deadletterqueue.topic.name.prefix` (`dlq.` by default).
SHARE_DLQ_TOPIC_CONFIG: Mapping[str, str] = MappingProxyType({"errors.deadletterqueue.group.enable": "true"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareGroupConfig:
    """A share group's own settings (dynamic group configs; None leaves a setting as it is).

    The broker bounds them (lock 15-60 s and delivery count 2-10 by default, `group.share.min.*`/`max.*`) and
    refuses the whole change, naming the setting, when one is out of range."""

    auto_offset_reset: str | None = None  # "earliest" | "latest" (Kafka's default: latest)
    record_lock_duration_ms: int | None = None
    delivery_count_limit: int | None = None
    isolation_level: str | None = None  # "read_committed" | "read_uncommitted" (Kafka's default)
    dlq_topic: str | None = None  # KIP-1191: the broker's own DLQ for what it archives
    dlq_copy_record: bool | None = None  # the DLQ record carries the key and value, not only headers
    heartbeat_interval_ms: int | None = None  # how soon a joining member gets its assignment

    def __post_init__(self) -> None:
        if self.auto_offset_reset not in (None, "earliest", "latest"):
            raise ConfigError("auto_offset_reset", self.auto_offset_reset, "expected earliest or latest")
        if self.isolation_level not in (None, "read_committed", "read_uncommitted"):
            raise ConfigError("isolation_level", self.isolation_level, "expected read_committed or read_uncommitted")
        for name in ("record_lock_duration_ms", "delivery_count_limit", "heartbeat_interval_ms"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(name, value, "must be at least 1")

    def properties(self) -> dict[str, str]:
        """The group configs this sets, by Kafka's names."""
        named = {
            "share.auto.offset.reset": self.auto_offset_reset,
            "share.record.lock.duration.ms": self.record_lock_duration_ms,
            "share.delivery.count.limit": self.delivery_count_limit,
            "share.isolation.level": self.isolation_level,
            "errors.deadletterqueue.topic.name": self.dlq_topic,
            "errors.deadletterqueue.copy.record.enable": self.dlq_copy_record,
            "share.heartbeat.interval.ms": self.heartbeat_interval_ms,
        }
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in named.items() if v is not None}


def set_share_group_config(
    admin: AdminClient, group_id: str, config: ShareGroupConfig, *, timeout_s: float = 30.0
) -> None:
    """Set a share group's configs (incrementally: the others stay), returning once the broker answering
    `describe_configs` applies them (a `KafkaClientError` if not within `timeout_s`). The group need not exist
    yet: set them before its first member joins, or `auto_offset_reset` comes too late for the records
    already there."""
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in config.properties().items()
    ]
    if not entries:
        return
    resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=entries)
    deadline = time.monotonic() + timeout_s
    with map_kafka_errors():
        for future in admin.incremental_alter_configs([resource], request_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
    # A group config is applied by the controller and reaches the brokers with their metadata a moment later:
    # a member joining in between would start with the old ones (an `auto_offset_reset` of latest, say).
    wanted = config.properties()
    while True:
        applied = share_group_config(admin, group_id, timeout_s=max(deadline - time.monotonic(), 1.0))
        pending = sorted(name for name, value in wanted.items() if applied.get(name) != value)
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise KafkaClientError(
                f"share group {group_id!r}: {', '.join(pending)} set but not applied by the broker within "
                f"{timeout_s:g} s",
                code="_TIMED_OUT",
                retriable=True,
            )
        time.sleep(0.05)


def share_group_config(admin: AdminClient, group_id: str, *, timeout_s: float = 30.0) -> dict[str, str]:
    """A group's share-group and dead-letter configs as the broker applies them (its defaults included)."""
    resource = ConfigResource(ResourceType.GROUP, group_id)
    with map_kafka_errors():
        [future] = admin.describe_configs([resource], request_timeout=timeout_s).values()
        entries = future.result(timeout=timeout_s)
    return {
        name: entry.value or ""
        for name, entry in entries.items()
        if name.startswith(("share.", "errors.deadletterqueue."))
    }


def share_group_provisioning(
    group_id: str, *, broker_dlq: bool, replication_factor: int = -1, config: Mapping[str, str] | None = None
) -> tuple[list[TopicSpec], ShareGroupConfig]:
    """What provisioning a share group sets up: the topics to ensure and the group configs to set.

    The group starts at the earliest record (Kafka's share-group default, latest, skips what was written
    before the first member joined). With `broker_dlq`, the broker's own DLQ (KIP-1191) is set as a safety
    net for what the consumer could not dead-letter itself (its process died first): topic
    `dlq.<group>` with `SHARE_DLQ_TOPIC_CONFIG` (one partition: the broker writes there only what it archives,
    and one count for every source keeps provisioning each pipeline of the group idempotent), and the group
    configs naming it, with record copies (without them the broker wrote nothing, docs/share-groups.md)."""
    settings = ShareGroupConfig(auto_offset_reset="earliest")
    if not broker_dlq:
        return [], settings
    topic = broker_dlq_topic(group_id)
    spec = TopicSpec(
        name=topic,
        partitions=1,
        replication_factor=replication_factor,
        config={**(config or {}), **SHARE_DLQ_TOPIC_CONFIG},
    )
    return [spec], replace(settings, dlq_topic=topic, dlq_copy_record=True)
