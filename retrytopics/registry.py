"""The handlers an app registered: which source topic each serves, with its policy, topics and routing context.

Registration is where a handler's configuration is checked, so that a mistake fails at start-up with the field
named, never later in a consumer thread: a topic handled twice, two sources that would share tier topics, or
in-process retries that would outlast the consumer's `max.poll.interval.ms`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from retrytopics.connectors.serde import Deserializer
from retrytopics.core.concurrency import Concurrency, OrderMode, concurrency_of
from retrytopics.core.durations import DurationLike, parse_duration
from retrytopics.core.errors import ConfigError
from retrytopics.core.flood_guard import FloodGuard
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.core.naming import NamingStrategy, TopicSet, topics_for, validate_topic_name
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.redaction import Redactor
from retrytopics.core.router import RouteContext
from retrytopics.core.signing import HeaderKeys
from retrytopics.runtime.records.calls import Binding

__all__ = ["Registration", "Registry"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """What `RetryApp.handler`/`batch_handler` were asked for, before it is checked."""

    topic: str
    policy: RetryPolicy | None
    value_deserializer: Deserializer
    dlq: str | None
    handler_budget: DurationLike
    batch: bool
    ordering: KeyOrdering | None = None
    flood_guard: FloodGuard | None = None
    concurrency: int | Concurrency = 1


class Registry:
    """Source topic → `Binding`, for one consumer group; every binding checked against the others."""

    def __init__(
        self,
        *,
        group: str,
        naming: NamingStrategy,
        id_header: str | None,
        redact: Redactor,
        header_keys: HeaderKeys | None,
    ) -> None:
        self._group = group
        self._naming = naming
        self._id_header = id_header
        self._redact = redact
        self._header_keys = header_keys
        self._bindings: dict[str, Binding] = {}
        self._flood_guards: dict[str, FloodGuard] = {}

    def add(
        self, wanted: Registration, max_poll_interval_ms: Callable[[], int]
    ) -> Callable[[Callable[..., Any]], None]:
        """Check `wanted` now and return what binds the decorated function to it. `max_poll_interval_ms` is
        asked only when in-process retries must fit in it."""
        topic = validate_topic_name(wanted.topic, field="topic")
        policy = self._checked_policy(wanted, max_poll_interval_ms)
        ordering = self._checked_ordering(wanted)
        flood_guard = self._checked_flood_guard(wanted)
        concurrency = self._checked_concurrency(wanted)
        if topic in self._bindings:
            raise ConfigError("topic", topic, f"already handled by {self._bindings[topic].name}")
        topics = topics_for(topic, self._group, policy.tier_delays_ms, strategy=self._naming, dlq=wanted.dlq)
        self._check_collisions(topics)
        if ordering is not None and topics.key_state_topic in {topics.source, *topics.all_topics}:
            raise ConfigError("dlq", topics.dlq, f"{topics.key_state_topic!r} is the key-state topic of this handler")
        ctx = RouteContext(
            policy=policy,
            topics=topics,
            group=self._group,
            id_header=self._id_header,
            redact=self._redact,
            header_keys=self._header_keys,
        )

        def bind(fn: Callable[..., Any]) -> None:
            if not callable(fn):
                what = "a list of Records" if wanted.batch else "a Record"
                raise ConfigError("handler", fn, f"expected a callable taking {what}")
            self._bindings[topic] = Binding(
                topic=topic,
                handler=fn,
                policy=policy,
                ctx=ctx,
                value_deserializer=wanted.value_deserializer,
                batch=wanted.batch,
                ordering=ordering,
                concurrency=concurrency,
            )
            if flood_guard is not None:
                self._flood_guards[topic] = flood_guard

        return bind

    @staticmethod
    def _checked_flood_guard(wanted: Registration) -> FloodGuard | None:
        guard = wanted.flood_guard
        if guard is None:
            return None
        if not isinstance(guard, FloodGuard):
            raise ConfigError("flood_guard", guard, "expected a FloodGuard, e.g. flood_guard=FloodGuard()")
        # not yet: a key-ordered batch call is cut and settled inside key order's admission (docs/flood-guard.md)
        if wanted.ordering is not None and wanted.batch:
            raise ConfigError("flood_guard", guard, "not with a key-ordered batch handler yet")
        return guard

    def set_concurrency(self, concurrency: int | Concurrency, *, topic: str | None) -> None:
        """Replace the concurrency of `topic`'s handler (None: every handler's), checked as at registration."""
        if topic is not None and topic not in self._bindings:
            raise ConfigError("topic", topic, f"no handler for it; handled: {sorted(self._bindings)}")
        for name in [topic] if topic is not None else list(self._bindings):
            binding = self._bindings[name]
            wanted = Registration(
                topic=name,
                policy=binding.policy,
                value_deserializer=binding.value_deserializer,
                dlq=None,
                handler_budget="1s",
                batch=binding.batch,
                ordering=binding.ordering,
                flood_guard=self._flood_guards.get(name),
                concurrency=concurrency,
            )
            self._bindings[name] = dataclasses.replace(binding, concurrency=self._checked_concurrency(wanted))

    @staticmethod
    def _checked_concurrency(wanted: Registration) -> Concurrency | None:
        """The handler's window, or None for one call at a time (today's path, unchanged)."""
        config = concurrency_of(wanted.concurrency)
        if not config.windowed:
            return None
        # not yet: each needs its own rule for records in flight together (docs/concurrency.md, "Refused")
        if wanted.batch:
            raise ConfigError("concurrency", wanted.concurrency, "not with a batch handler yet")
        if wanted.ordering is not None and config.order is OrderMode.NONE:
            # key order's decision per record needs its key's records started one at a time, in offset order
            raise ConfigError("concurrency.order", config.order, "key ordering needs OrderMode.KEY or PARTITION")
        if wanted.flood_guard is not None:
            raise ConfigError("concurrency", wanted.concurrency, "not with a flood guard yet")
        return config

    @staticmethod
    def _checked_ordering(wanted: Registration) -> KeyOrdering | None:
        if wanted.ordering is None:
            return None
        if not isinstance(wanted.ordering, KeyOrdering):
            raise ConfigError("ordering", wanted.ordering, "expected a KeyOrdering, e.g. ordering=KeyOrdering()")
        return wanted.ordering

    @staticmethod
    def _checked_policy(wanted: Registration, max_poll_interval_ms: Callable[[], int]) -> RetryPolicy:
        policy = RetryPolicy() if wanted.policy is None else wanted.policy
        if not isinstance(policy, RetryPolicy):
            raise ConfigError("policy", policy, "expected a RetryPolicy")
        if policy.in_process is None:
            return policy
        if wanted.batch:
            raise ConfigError(
                "policy.in_process",
                policy.in_process,
                "in-process retries are per record; a batch handler's failed records are retried through the tiers",
            )
        budget_ms = parse_duration(wanted.handler_budget, field="handler_budget")
        policy.in_process.check_fits(max_poll_interval_ms(), handler_budget_ms=budget_ms)
        return policy

    def _check_collisions(self, topics: TopicSet) -> None:
        mine = {t.topic for t in topics.tiers}
        for other in self._bindings.values():
            theirs = {t.topic for t in other.ctx.topics.tiers} | {other.topic}
            if mine & theirs or topics.source in {t.topic for t in other.ctx.topics.tiers}:
                raise ConfigError(
                    "naming",
                    self._naming.value,
                    f"{topics.source!r} and {other.topic!r} would share "
                    f"tier topics {sorted(mine & theirs)}; use NamingStrategy.BY_DELAY",
                )

    @property
    def flood_guards(self) -> Mapping[str, FloodGuard]:
        """Source topic -> the retry-flood guard of its handler, for the handlers that have one."""
        return MappingProxyType(self._flood_guards)

    @property
    def bindings(self) -> Mapping[str, Binding]:
        return MappingProxyType(self._bindings)

    def get(self, topic: str) -> Binding:
        if topic not in self._bindings:
            raise ConfigError("topic", topic, f"no handler for it; handled: {sorted(self._bindings)}")
        return self._bindings[topic]

    def for_topics(self, topics: Iterable[str]) -> dict[str, Binding]:
        """Each of `topics` (sources and tier topics) → the binding that handles its records."""
        wanted = set(topics)
        chosen = {t: b for t, b in self._bindings.items() if t in wanted}
        for binding in self._bindings.values():
            for tier in binding.ctx.topics.tiers:
                if tier.topic in wanted:
                    chosen[tier.topic] = binding
        return chosen
