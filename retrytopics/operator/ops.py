"""Operator actions behind the CLI: provision and describe a retry pipeline's topics, peek at a DLQ.

Each function takes validated settings and returns plain data; `cli.py` only parses arguments and prints.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from retrytopics.connectors.admin import (
    ProvisionOutcome,
    TopicSpec,
    committed_offsets,
    end_offsets,
    ensure_topics,
    key_state_spec,
    less_durable,
    partition_count,
    read_at,
    replication_config,
    set_share_group_config,
    share_group_config,
    share_group_provisioning,
    topic_durability,
)
from retrytopics.connectors.clients import read_to_end
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_consumer, map_kafka_errors, open_tail
from retrytopics.connectors.record_headers import read_headers
from retrytopics.core.errors import ConfigError, HeaderDecodeError, KafkaClientError, KeyStateDecodeError
from retrytopics.core.headers import decode, user_headers
from retrytopics.core.keyorder.state_records import Chain, decode_record
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message
from retrytopics.core.signing import HeaderKeys, verify_state
from retrytopics.operator.config import AppSettings

__all__ = [
    "KeyStateView",
    "OpenChain",
    "PartitionState",
    "PeekedRecord",
    "describe_key_state",
    "describe_pipeline",
    "durability_warnings",
    "open_chains",
    "peek_dlq",
    "pipeline_topics",
    "printable",
    "provision_pipeline",
]

log = logging.getLogger("retrytopics.ops")


def pipeline_topics(app: AppSettings) -> TopicSet:
    """The tier and DLQ topics of the pipeline that `app` describes."""
    app.require("topic", "group", "delays")  # no default ladder: a guessed one names topics that do not exist
    assert app.topic is not None and app.group is not None and app.delays is not None
    policy = RetryPolicy(delays=app.delays)
    return topics_for(app.topic, app.group, policy.tier_delays_ms, strategy=app.naming, dlq=app.dlq)


def provision_pipeline(
    kafka: KafkaConfig, app: AppSettings, *, create_source: bool = False, broker_dlq: bool = True
) -> dict[str, ProvisionOutcome]:
    """Create the tier topics and the DLQ (idempotent), the key-state topic when `app.key_ordering`, and the
    source topic too when `create_source`.
    Tiers get as many partitions as the source topic unless `app.partitions` says otherwise, so that keyless
    records keep their partition number; new topics get `app.replication_factor` and `app.min_insync_replicas`.
    For a share-group pipeline (`app.consumer == "share"`), also the share group's settings and, with
    `broker_dlq`, the broker's own DLQ (`share_group_provisioning`)."""
    topics = pipeline_topics(app)
    admin = make_admin(kafka)
    outcome: dict[str, ProvisionOutcome] = {}
    config = replication_config(app.min_insync_replicas)
    if create_source:
        app.require("partitions")
        source = TopicSpec(
            name=topics.source, partitions=app.partitions or 1, replication_factor=app.replication_factor, config=config
        )
        outcome.update(ensure_topics(admin, [source]))
    partitions = app.partitions or partition_count(admin, topics.source)
    if partitions is None:
        raise ConfigError("app.partitions", None, f"source topic {topics.source!r} does not exist; pass --partitions")
    specs = [
        TopicSpec(name=name, partitions=partitions, replication_factor=app.replication_factor, config=config)
        for name in topics.all_topics
    ]
    if app.key_ordering:
        specs.append(key_state_spec(topics, partitions, app.replication_factor, config))
    if app.flood_guard:  # one partition: a few records per process (docs/flood-guard.md)
        guard_config = {**config, "cleanup.policy": "compact"}
        specs.append(
            TopicSpec(
                name=topics.flood_guard_topic,
                partitions=1,
                replication_factor=app.replication_factor,
                config=guard_config,
            )
        )
    share = app.consumer == "share"
    share_specs, share_config = share_group_provisioning(
        topics.group, broker_dlq=share and broker_dlq, replication_factor=app.replication_factor, config=config
    )
    outcome.update(ensure_topics(admin, [*specs, *share_specs]))
    if share:
        set_share_group_config(admin, topics.group, share_config)
    _warn_less_durable(kafka, app)
    return outcome


def _warn_less_durable(kafka: KafkaConfig, app: AppSettings) -> None:
    try:
        warnings = durability_warnings(kafka, app)
    except KafkaClientError as exc:  # advice only: a broker that will not describe configs works the same
        log.debug("replication of the pipeline's topics not compared: %s", exc)
        return
    for warning in warnings:
        log.warning("%s", warning)


def durability_warnings(kafka: KafkaConfig, app: AppSettings) -> list[str]:
    """One line per tier or DLQ topic of the pipeline that is less durable than its source (fewer replicas,
    or a lower `min.insync.replicas`): a record handed off there is more easily lost than it was."""
    topics = pipeline_topics(app)
    return less_durable(topics.source, topic_durability(make_admin(kafka), [topics.source, *topics.all_topics]))


def printable(data: bytes | None, limit: int = 200) -> str | None:
    """Bytes as text when they are UTF-8, else `base64:`-prefixed; bounded, for terminals and JSON."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
        if text.isprintable():
            return text if len(text) <= limit else text[:limit] + "…"
    except UnicodeDecodeError:
        pass
    encoded = base64.b64encode(data[: limit * 3 // 4]).decode()
    return "base64:" + encoded + ("…" if len(data) > limit * 3 // 4 else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class PeekedRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    value: str | None
    user_headers: dict[str, str | None]
    retry: dict[str, object] | None
    header_error: str | None

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}


def _peeked(message: object) -> PeekedRecord:
    headers, unreadable = read_headers(message)
    retry: dict[str, object] | None = None
    error: str | None = None if unreadable is None else str(unreadable)
    try:
        decoded = decode(headers)
        retry = {
            "reason": decoded.dlq_reason.value if decoded.dlq_reason else None,
            "reconsume_times": decoded.reconsume_times,
            "origin_message_id": decoded.origin_message_id,
            "original": f"{decoded.original_topic}[{decoded.original_partition}]@{decoded.original_offset}",
            "exception_type": decoded.exception_type,
            "exception_message": decoded.exception_message,
            "first_failed_at": decoded.first_failed_at,
            "last_failed_at": decoded.last_failed_at,
            "replay_count": decoded.lineage.replay_count,
        }
    except HeaderDecodeError as exc:
        error = str(exc) if error is None else f"{error}; {exc}"
    return PeekedRecord(
        topic=message.topic(),  # type: ignore[attr-defined]
        partition=message.partition(),  # type: ignore[attr-defined]
        offset=message.offset(),  # type: ignore[attr-defined]
        timestamp_ms=message.timestamp()[1],  # type: ignore[attr-defined]
        key=printable(message.key()),  # type: ignore[attr-defined]
        value=printable(message.value()),  # type: ignore[attr-defined]
        user_headers={k: printable(v, 80) for k, v in user_headers(headers)},
        retry=retry,
        header_error=error,
    )


def peek_dlq(
    kafka: KafkaConfig, topic: str, *, last: int = 20, follow: bool = False, idle_timeout_s: float = 2.0
) -> Iterator[PeekedRecord]:
    """The last `last` records of each DLQ partition (oldest first), then new ones while `follow`.
    Reads with assign(): it never joins a consumer group and never commits."""
    admin = make_admin(kafka)
    partitions = partition_count(admin, topic)
    if partitions is None:
        raise ConfigError("dlq", topic, "topic does not exist")
    consumer = open_tail(kafka, topic, partitions, last=last)
    try:
        yield from _drain(consumer, follow, idle_timeout_s)
    finally:
        consumer.close()


def _drain(consumer: object, follow: bool, idle_timeout_s: float) -> Iterator[PeekedRecord]:
    idle_since = time.monotonic()
    while follow or time.monotonic() - idle_since < idle_timeout_s:
        messages = consumer.consume(500, 0.2)  # type: ignore[attr-defined]
        for message in messages:
            if message.error() is None:
                idle_since = time.monotonic()
                yield _peeked(message)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionState:
    """One partition of a pipeline topic as an operator sees it."""

    topic: str
    kind: str  # "source" | "tier" | "dlq"
    partition: int
    end_offset: int
    committed: int | None
    lag: int | None
    state: str  # "idle", "waiting 12.3s" (paused until due: normal), "overdue 45.0s" (stuck), "-"
    replicas: int
    in_sync_replicas: int
    min_insync_replicas: int | None  # the topic's effective setting (its own, else the broker's default)

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}


def _head_state(kafka: KafkaConfig, topic: str, partition: int, offset: int, now_ms: int, grace_ms: int) -> str:
    message = read_at(kafka, topic, partition, offset)
    if message is None:
        return "unknown"
    try:
        due_at = decode(read_headers(message)[0]).due_at
    except HeaderDecodeError:
        return "invalid headers at head"
    if due_at is None:
        return "unknown"
    if due_at > now_ms:
        return f"waiting {(due_at - now_ms) / 1000:.1f}s"
    return f"overdue {(now_ms - due_at) / 1000:.1f}s" if now_ms - due_at > grace_ms else "due"


def describe_pipeline(kafka: KafkaConfig, app: AppSettings, *, grace_ms: int = 30_000) -> list[PartitionState]:
    """End offsets, committed offsets and lag of the source (main group), each tier (its own group: the tier
    topic's name) and the DLQ; for a tier partition with lag, whether its head record is still waiting for
    its due time (the consumer is paused on it, as designed) or overdue (no consumer, or a stuck one); the
    replicas and in-sync replicas of each partition and each topic's `min.insync.replicas`."""
    topics = pipeline_topics(app)
    admin = make_admin(kafka)
    replication = _replication(admin, [topics.source, *topics.all_topics])
    _warn_less_durable(kafka, app)
    now_ms = int(time.time() * 1000)
    rows: list[PartitionState] = []
    # a share group commits no offsets: its source has no committed position or lag (`describe_share_group`)
    plan = [
        (topics.source, "source", None if app.consumer == "share" else app.group),
        *[(t.topic, "tier", t.topic) for t in topics.tiers],
        (topics.dlq, "dlq", None),
    ]
    for topic, kind, group in plan:
        partitions = partition_count(admin, topic)
        if partitions is None:
            raise ConfigError("app.topic", topic, "topic does not exist; run `retrytopics topics create` first")
        consumer = make_consumer(kafka, group_id=None)
        try:
            ends = end_offsets(consumer, topic, partitions)
        finally:
            consumer.close()
        committed = committed_offsets(kafka, group, topic, partitions) if group else {}
        for p in range(partitions):
            start = committed.get(p)
            lag = None if group is None else ends[p] - (start or 0)
            state = "share group" if kind == "source" and app.consumer == "share" else "-"
            if kind == "tier":
                state = "idle" if not lag else _head_state(kafka, topic, p, start or 0, now_ms, grace_ms)
            replicas, in_sync, min_insync = replication.get((topic, p), (0, 0, None))
            rows.append(
                PartitionState(
                    topic=topic,
                    kind=kind,
                    partition=p,
                    end_offset=ends[p],
                    committed=start,
                    lag=lag,
                    state=state,
                    replicas=replicas,
                    in_sync_replicas=in_sync,
                    min_insync_replicas=min_insync,
                )
            )
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenChain:
    """A blocked key of a key-ordered handler, from its live chain record (docs/key-ordering.md, section 5):
    its source partition, its key id in hex (`key_id`: a short key tagged ``00``, a longer one's digest
    tagged ``01``, so a long key's bytes are never shown), the chain's head and frontier (source offsets),
    the tier its followers go to, how many followed, and when it opened (epoch ms, -1 unknown)."""

    partition: int
    key_id: str
    head: int
    frontier: int
    at_tier: int
    followers: int
    since_ms: int

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyStateView:
    """What a key-state topic says now: its open chains (oldest first) and how many of its live records
    were skipped as malformed, and with header keys how many of its records as unsigned or forged (never
    trusted)."""

    topic: str
    chains: tuple[OpenChain, ...]
    malformed: int
    forged: int = 0

    def blocked_keys(self, partitions: int) -> dict[int, int]:
        """Open chains per source partition, every partition of `partitions` listed."""
        counts = dict.fromkeys(range(partitions), 0)
        for chain in self.chains:
            counts[chain.partition] = counts.get(chain.partition, 0) + 1
        return counts

    def as_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "malformed": self.malformed,
            "forged": self.forged,
            "chains": [c.as_dict() for c in self.chains],
        }


def open_chains(
    messages: Iterable[Message], source: str, *, keys: HeaderKeys | None = None
) -> tuple[list[OpenChain], int, int]:
    """The open chains of `source` in key-state records read in log order, by compaction's rule (the latest
    record of a key wins, a tombstone deletes it, so the answer is the same before and after the broker
    compacts), how many live records are malformed: one `decode_record` refuses, a chain record of
    another source, or one read from a partition other than its chain's source partition (the writers
    never put it there), and how many records were unsigned or forged: with `keys`, a record whose
    `retry.signature` does not verify (`verify_state`) is skipped before the fold, as the runtime skips it.
    Passages (`tier<i>/...`) are the tiers' and are not shown."""
    forged = 0
    live: dict[tuple[int, bytes | None], Message] = {}
    for message in messages:
        if keys is not None and verify_state(keys, message.topic, message.key, message.value, message.headers):
            forged += 1
            continue
        where = (message.partition, message.key)  # compaction keeps the latest per key in each partition
        live.pop(where, None)
        if message.value is not None:
            live[where] = message
    chains: list[OpenChain] = []
    malformed = 0
    for message in live.values():
        try:
            record = decode_record(message.key, message.value)
        except KeyStateDecodeError:
            malformed += 1
            continue
        if not isinstance(record, Chain):
            continue
        if record.chain.source_topic != source or record.chain.source_partition != message.partition:
            malformed += 1
            continue
        chains.append(
            OpenChain(
                partition=record.chain.source_partition,
                key_id=record.chain.key.hex(),
                head=record.head,
                frontier=record.frontier,
                at_tier=record.at_tier,
                followers=record.followers,
                since_ms=record.since_ms,
            )
        )
    chains.sort(key=lambda c: (c.partition, c.since_ms, c.key_id))
    return chains, malformed, forged


def describe_key_state(kafka: KafkaConfig, app: AppSettings, *, timeout_s: float = 30.0) -> KeyStateView | None:
    """The open chains of a key-ordered pipeline's key-state topic (None for a pipeline without key
    ordering), read to its end now; a missing topic is a `ConfigError` naming the fix."""
    if not app.key_ordering:
        return None
    topics = pipeline_topics(app)
    name = topics.key_state_topic
    if partition_count(make_admin(kafka), name) is None:
        raise ConfigError(
            "app.key_ordering", name, "the key-state topic does not exist; run `retrytopics topics create`"
        )
    messages = read_to_end(kafka, name, None, timeout_s=timeout_s)
    chains, malformed, forged = open_chains(messages, topics.source, keys=app.header_keys)
    return KeyStateView(topic=name, chains=tuple(chains), malformed=malformed, forged=forged)


#: what `describe_share_group` cannot say, and why (docs/share-groups.md)
SHARE_STATE_UNAVAILABLE = (
    "members, in-flight and acquired records: not available (confluent-kafka 2.16 cannot describe share groups; "
    "docs/share-groups.md)"
)


def describe_share_group(kafka: KafkaConfig, app: AppSettings) -> dict[str, str]:
    """A share-group pipeline's group settings as the broker applies them (delivery count limit, record lock,
    offset reset, the broker's own DLQ), by Kafka's names; empty for a consumer-group pipeline. The group's
    members and the records they hold cannot be read with this client (`SHARE_STATE_UNAVAILABLE`)."""
    if app.consumer != "share":
        return {}
    return share_group_config(make_admin(kafka), pipeline_topics(app).group)


def _replication(admin: object, names: list[str]) -> dict[tuple[str, int], tuple[int, int, int | None]]:
    """(topic, partition) -> (replicas, in-sync replicas, the topic's min.insync.replicas)."""
    with map_kafka_errors():
        metadata = admin.list_topics(timeout=10).topics  # type: ignore[attr-defined]
    try:
        durability = topic_durability(admin, names)  # type: ignore[arg-type]
    except KafkaClientError as exc:  # a broker that will not describe configs: the column stays empty
        log.debug("min.insync.replicas of the pipeline's topics not read: %s", exc)
        durability = {}
    return {
        (name, p): (
            len(meta.replicas),
            len(meta.isrs),
            durability[name].min_insync_replicas if name in durability else None,
        )
        for name in names
        if name in metadata
        for p, meta in metadata[name].partitions.items()
    }
