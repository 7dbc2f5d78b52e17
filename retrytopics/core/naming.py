"""Topic naming: one tier topic per distinct delay, one DLQ, per consumer group.

Pure: standard library only. A failure belongs to a consumer group (RocketMQ's ``%RETRY%<group>``), so
every name includes the group::

    >>> ts = topics_for("orders", "billing", (30_000, 300_000))
    >>> ts.all_topics
    ('orders.billing.retry.30s', 'orders.billing.retry.5m', 'orders.billing.dlq')

Names follow Kafka's rules (``[a-zA-Z0-9._-]``, 1..249 characters, not ``.`` or ``..``); an illegal name is
a :class:`~retrytopics.errors.ConfigError` at start-up, not a broker error later.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from retrytopics.core.durations import format_duration
from retrytopics.core.errors import ConfigError

__all__ = [
    "MAX_TOPIC_LENGTH",
    "NamingStrategy",
    "TierTopic",
    "TopicSet",
    "topics_for",
    "validate_topic_name",
]

#: Kafka's limit (``Topic.MAX_NAME_LENGTH``).
MAX_TOPIC_LENGTH: Final = 249
_LEGAL: Final = re.compile(r"[a-zA-Z0-9._-]+")


class NamingStrategy(StrEnum):
    """How tier and DLQ topics are named."""

    BY_DELAY = "by_delay"
    """``<topic>.<group>.retry.<delay>`` (e.g. ``orders.billing.retry.30s``) and ``<topic>.<group>.dlq``.
    The default: a name says its delay, and stays the same when other tiers are added or removed."""
    BY_INDEX = "by_index"
    """``<topic>.<group>.retry.<index>`` (0-based, like Spring's suffix-with-index) and ``<topic>.<group>.dlq``.
    Adding a shorter tier renumbers the longer ones: drain the tiers before changing such a policy."""
    SHARED = "shared"
    """``<group>.retry.<delay>`` and ``<group>.dlq``: one set of tiers carries every source topic of the
    group; ``retry.original_topic`` tells the records apart."""


def validate_topic_name(name: str, *, field: str) -> str:
    """Return ``name`` if Kafka accepts it as a topic name; raise :class:`ConfigError` naming ``field``."""
    if not isinstance(name, str):
        raise ConfigError(field, name, "a topic name must be a string")
    if not 1 <= len(name) <= MAX_TOPIC_LENGTH:
        raise ConfigError(field, name, f"a topic name has 1..{MAX_TOPIC_LENGTH} characters, not {len(name)}")
    if name in (".", ".."):
        raise ConfigError(field, name, "'.' and '..' are not legal topic names")
    if not _LEGAL.fullmatch(name):
        raise ConfigError(field, name, "a topic name may contain only ASCII letters, digits, '.', '_' and '-'")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class TierTopic:
    """One tier: its index (the value of ``retry.tier``), its delay, and its topic."""

    index: int
    delay_ms: int
    topic: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicSet:
    """The tier topics and the DLQ of one source topic for one consumer group."""

    source: str
    group: str
    tiers: tuple[TierTopic, ...]
    dlq: str
    strategy: NamingStrategy = NamingStrategy.BY_DELAY

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiers", tuple(self.tiers))
        names = [self.source, *(t.topic for t in self.tiers), self.dlq]
        if len(set(names)) != len(names):
            raise ConfigError("topics", names, "the source, tier and DLQ topics must all be different")
        for position, tier in enumerate(self.tiers):
            if tier.index != position:
                raise ConfigError(f"tiers[{position}].index", tier.index, "tier indexes run 0, 1, 2, ... in order")
        delays = [t.delay_ms for t in self.tiers]
        if delays != sorted(set(delays)):
            raise ConfigError("tiers", delays, "tier delays must be distinct and ascending")

    def tier_by_topic(self, topic: str) -> TierTopic | None:
        """The tier whose topic is ``topic``, or None (e.g. for the source topic)."""
        for tier in self.tiers:  # a plain loop: asked once per tier record, and once per failure by delay
            if tier.topic == topic:
                return tier
        return None

    def tier_by_delay(self, delay_ms: int) -> TierTopic:
        """The tier with exactly this delay; a :class:`ConfigError` means the TopicSet and policy disagree."""
        for tier in self.tiers:
            if tier.delay_ms == delay_ms:
                return tier
        raise ConfigError("delay_ms", delay_ms, "no tier has this delay; build the TopicSet from policy.tier_delays_ms")

    @property
    def all_topics(self) -> tuple[str, ...]:
        """Every topic to provision: the tiers in order, then the DLQ (not the source, nor `key_state_topic`)."""
        return (*(t.topic for t in self.tiers), self.dlq)

    @property
    def key_state_topic(self) -> str:
        """The compacted key-state topic of a key-ordered handler (docs/key-ordering.md, section 5):
        ``<topic>.<group>.keys``, or ``<group>.keys`` with `NamingStrategy.SHARED`. Provisioned only for a
        handler declared with ``ordering=``."""
        prefix = self.group if self.strategy is NamingStrategy.SHARED else f"{self.source}.{self.group}"
        return validate_topic_name(f"{prefix}.keys", field="key_state_topic")

    @property
    def flood_guard_topic(self) -> str:
        """The compacted topic of a guarded handler's retry-flood guard (docs/flood-guard.md): each process's
        guard reports its state there, and an operator's command to open or close it is read from there by every
        process. ``<topic>.<group>.guard``, or ``<group>.guard`` with `NamingStrategy.SHARED` (the handler is in
        each record's key). Provisioned only for a handler declared with ``flood_guard=``."""
        prefix = self.group if self.strategy is NamingStrategy.SHARED else f"{self.source}.{self.group}"
        return validate_topic_name(f"{prefix}.guard", field="flood_guard_topic")


def topics_for(
    source: str,
    group: str,
    tier_delays_ms: Sequence[int],
    *,
    strategy: NamingStrategy = NamingStrategy.BY_DELAY,
    dlq: str | None = None,
) -> TopicSet:
    """Name the tier topics and the DLQ of ``source`` for ``group``; ``dlq`` overrides the DLQ name.

    ``tier_delays_ms`` is ``RetryPolicy.tier_delays_ms``: ascending, distinct. Duplicates are refused: two
    tiers with one delay would need two topics with one name.
    """
    validate_topic_name(source, field="source")
    validate_topic_name(group, field="group")  # the group becomes part of topic names
    if strategy not in set(NamingStrategy):
        raise ConfigError("strategy", strategy, f"expected one of {[s.value for s in NamingStrategy]}")
    strategy = NamingStrategy(strategy)
    _check_delays(tier_delays_ms)
    prefix = group if strategy is NamingStrategy.SHARED else f"{source}.{group}"
    tiers = tuple(
        TierTopic(
            index=i,
            delay_ms=delay,
            topic=validate_topic_name(
                f"{prefix}.retry.{i if strategy is NamingStrategy.BY_INDEX else format_duration(delay)}",
                field=f"tiers[{i}].topic",
            ),
        )
        for i, delay in enumerate(tier_delays_ms)
    )
    dlq_topic = validate_topic_name(dlq if dlq is not None else f"{prefix}.dlq", field="dlq")
    return TopicSet(source=source, group=group, tiers=tiers, dlq=dlq_topic, strategy=strategy)


def _check_delays(tier_delays_ms: Sequence[int]) -> None:
    seen: set[int] = set()
    for i, delay in enumerate(tier_delays_ms):
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ConfigError(f"tier_delays_ms[{i}]", delay, "expected a non-negative int number of ms")
        if delay in seen:
            raise ConfigError(f"tier_delays_ms[{i}]", delay, "two tiers with the same delay would share one topic name")
        if seen and delay < max(seen):
            raise ConfigError(f"tier_delays_ms[{i}]", delay, "tier delays must be ascending, as in RetryPolicy")
        seen.add(delay)
