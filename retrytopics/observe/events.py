"""Named runtime events and the one hook protocol that observes them.

Pure: standard library only; the core never imports a metrics library. Logging and metrics subscribe::

    class Metrics:
        def on_event(self, event: Event, data: Mapping[str, object]) -> None:
            if event is Event.DLQ_DISPATCHED:
                dlq_counter.labels(reason=data["reason"]).inc()

    app = RetryApp(kafka=..., group="billing", hooks=[Metrics()])

Hooks run in the consumer thread that emitted the event, so they must be quick. A hook that raises is
logged and ignored: observability must never change what happens to a record.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import ClassVar, Protocol, runtime_checkable

__all__ = ["PER_BATCH", "SUMMED", "Emitter", "Event", "Hook", "LoggingHook", "NullHook", "Stats", "StatsCollector"]

log = logging.getLogger("retrytopics.events")


class Event(StrEnum):
    """What happened, in the past tense (`data` keys in brackets)."""

    CONSUMER_STARTED = "consumer.started"
    """A consumer loop started [consumer, group, topics, tier_topics (those of `topics` that are retry tiers)]."""
    CONSUMER_STOPPED = "consumer.stopped"
    """A consumer loop closed after draining and committing [consumer, group]."""
    PARTITIONS_ASSIGNED = "partitions.assigned"
    """The group gave this consumer partitions [consumer, partitions]."""
    PARTITIONS_REVOKED = "partitions.revoked"
    """Partitions were taken away after their finished offsets were committed [consumer, partitions]."""
    PARTITIONS_LOST = "partitions.lost"
    """Partitions were lost without a chance to commit (session or poll timeout) [consumer, partitions]."""
    RECORD_HANDLED = "record.handled"
    """A handler call returned [topic, partition, offset, attempt, due_at (None on a source topic), handled_at].
    Emitted per record only when a hook wants it (see `Hook`); `RECORDS_HANDLED` sums them per batch."""
    RECORDS_HANDLED = "records.handled"
    """The handler calls that returned for one partition in one poll batch [consumer, topic, partition, count,
    first_offset, last_offset, lateness_ms (handled_at - due_at of each retried record; empty on a source)]."""
    RECORD_FAILED = "record.failed"
    """A handler call raised (or the record could not be decoded); a route follows [topic, partition, offset,
    attempt, error, due_at, handled_at]. Emitted per record only when a hook wants it (see `Hook`);
    `RECORDS_FAILED` sums them per batch."""
    RECORDS_FAILED = "records.failed"
    """The handler calls that raised (or records that could not be decoded) for one partition in one poll batch
    [consumer, topic, partition, count, lateness_ms (handled_at - due_at of each retried record; empty on a
    source)]."""
    RECORD_ABANDONED = "record.abandoned"
    """This consumer lost ownership before it could act on a record; the new owner will [topic, partition, offset]."""
    RETRY_SCHEDULED = "retry.scheduled"
    """A failed record's republish to a tier was acknowledged [topic, partition, offset, destination, due_at].
    Emitted per record only when a hook wants it (see `Hook`); `RETRIES_SCHEDULED` sums them."""
    RETRIES_SCHEDULED = "retries.scheduled"
    """Republishes to one tier acknowledged together (one poll of the producer, or one transaction), for one
    source partition [consumer, topic, partition, destination, count]."""
    DLQ_DISPATCHED = "dlq.dispatched"
    """A record's DLQ publish was acknowledged [topic, partition, offset, destination, reason]."""
    PUBLISH_FAILED = "publish.failed"
    """A republish or DLQ publish failed and will be retried [destination, error, attempt]."""
    PRODUCER_RECREATED = "producer.recreated"
    """A producer hit a fatal error and was replaced [consumer, error]."""
    PARTITION_PAUSED = "partition.paused"
    """A partition was paused: its head record is not due yet, or a publish is failing [topic, partition, until]."""
    PARTITION_RESUMED = "partition.resumed"
    """A paused partition was resumed [topic, partition]."""
    DUE_CLAMPED = "due.clamped"
    """A tier record's `retry.due_at` lay beyond its tier's longest delay from when this consumer first saw it:
    skewed clocks or a forged due time; it waits until `clamped_to` instead [consumer, topic, partition, offset,
    due_at, clamped_to]."""
    DUPLICATE_SUPPRESSED = "duplicate.suppressed"
    """A tier record already handled once (same origin, replay count and attempt) was skipped [topic, partition,
    offset, origin_message_id, reconsume_times]."""
    OFFSETS_COMMITTED = "offsets.committed"
    """A commit was sent [consumer, offsets, synchronous]."""
    TRANSACTION_ABORTED = "transaction.aborted"
    """Exactly-once mode: a transaction was aborted and its partitions rewound [consumer, error]."""
    RECORDS_ACKNOWLEDGED = "records.acknowledged"
    """A share consumer acknowledged one poll batch [consumer, accepted, released, rejected, renewed (always 0
    with confluent-kafka 2.16, which has no RENEW), delivery_counts (delivery count -> records of the batch)]."""
    ACKNOWLEDGEMENT_FAILED = "acknowledgement.failed"
    """The broker refused a share consumer's acknowledgements (a lock had expired): those records come back
    [consumer, partitions, error]."""
    KEY_ORDER_BLOCKED = "key_order.blocked"
    """A key-ordered handler's record went to a tier, so its key is blocked: a chain opened (docs/key-ordering.md)
    [consumer, topic, partition, blocked_keys (open chains of that partition now)]."""
    KEY_ORDER_RELEASED = "key_order.released"
    """A chain closed: its key's next record is handled at once [consumer, topic, partition, blocked_keys]."""
    KEY_ORDER_FOLLOWED = "key_order.followed"
    """A record of a blocked key was handed off unhandled behind its predecessor [consumer, topic, partition,
    offset, destination]."""
    KEY_ORDER_UNPROVEN = "key_order.unproven"
    """A tier read a follower whose predecessor's fate nothing here proves (a forged record, a lost key-state
    topic, a chain forgotten past `max_tracked_records`): dead-lettered as ``blocked_by_key``, never handled out
    of order [consumer, topic, partition, offset]."""
    LAG_MEASURED = "lag.measured"
    """A consumer measured a partition's lag from the end offset it asked (runtime/lag.py; at most once a
    second, only while a hook wants it: it is not in `PER_BATCH`) [consumer, group, topic, partition, lag
    (records after the first unhandled one), lag_s (how long ago that record was appended), due_at (the due
    time of the record the partition waits on; None when it waits on none), measured_at]."""
    KEY_ORDER_BOUND_REACHED = "key_order.bound_reached"
    """A source partition paused at a key-order bound, once per episode: `max_blocked_keys` open chains
    (`bound="blocked_keys"`) or 1,000 records parked behind unacknowledged hops (`bound="parked"`) [consumer,
    topic, partition, bound]."""
    KEY_STATE_REFUSED = "key_state.refused"
    """Key-state records read (at assignment, or live by a main consumer) were skipped, never trusted: `malformed`
    ones that do not decode, and with `header_key` `forged` ones whose signature is missing or wrong
    (docs/key-ordering.md, section 9) [consumer, topic (the key-state topic), malformed, forged]."""

    CONCURRENCY_WINDOW_FULL = "concurrency.window_full"
    """A handler's in-flight window on one consumer filled (docs/concurrency.md): its partitions are held until
    calls return; once per episode [consumer, handler, in_flight]."""
    CONCURRENCY_SAMPLED = "concurrency.sampled"
    """A windowed handler's calls in flight and records waiting behind a key, sampled at most once a second per
    consumer [consumer, handler, in_flight, waiting]."""

    FLOOD_GUARD_OPENED = "flood_guard.opened"
    """A handler's retry-flood guard opened (docs/flood-guard.md): its consumers hold the handler's partitions
    for `backoff_ms`, then probe [handler, reason (`failure_ratio`, `dead_letters`, `probe_failed`),
    backoff_ms]."""
    FLOOD_GUARD_PROBED = "flood_guard.probed"
    """A half-open guard's probe call ended [handler, consumer, succeeded]."""
    FLOOD_GUARD_CLOSED = "flood_guard.closed"
    """A guard closed after its probes succeeded: calls ramp up again [handler, reason, open_ms]."""
    FLOOD_GUARD_REFUSED = "flood_guard.refused"
    """A guard refused a call: the record is read again later, its partition held meanwhile [handler,
    consumer, topic, partition]."""
    FLOOD_GUARD_DEFERRED = "flood_guard.deferred"
    """A record ran out of attempts while its handler's guard was open: not dead-lettered but read again from
    its partition once the guard lets calls through, the attempt not counted [handler, consumer, topic,
    partition, offset, reason (the DLQ reason it was spared: `exhausted`, `timeout`)]."""


@runtime_checkable
class Hook(Protocol):
    """Receives events. `data` is read-only and its keys are listed on each `Event` member.

    A hook may also have a `wanted_events` attribute, a set or frozenset of the events it wants: it then
    receives those only. Without it, a hook receives every event, `RECORD_HANDLED` included, which is then
    built once per handled record: a hook that can count `RECORDS_HANDLED` (one per partition and batch)
    instead keeps the success path lean by leaving `RECORD_HANDLED` out of its `wanted_events`.

    A hook may also have a `summed_events` attribute, a set or frozenset of the per-record failure events
    (`SUMMED`: `RECORD_FAILED`, `RETRY_SCHEDULED`) it counts from their sums (`RECORDS_FAILED`,
    `RETRIES_SCHEDULED`) instead: the loop then sends it the sums only, and builds the per-record events only
    when another hook wants them. The built-in hooks do so."""

    def on_event(self, event: Event, data: Mapping[str, object]) -> None: ...


#: Every event but the per-record success and the lag measurements: what the built-in hooks want (a hook that
#: wants `LAG_MEASURED` too, the Prometheus hook, makes each consumer ask its end offsets once a second).
PER_BATCH: frozenset[Event] = frozenset(Event) - {Event.RECORD_HANDLED, Event.LAG_MEASURED}

#: The per-record failure events that also come summed (`records.failed`, `retries.scheduled`): what the
#: built-in hooks count from the sums (`Hook`'s `summed_events`).
SUMMED: frozenset[Event] = frozenset({Event.RECORD_FAILED, Event.RETRY_SCHEDULED})


class NullHook:
    """Ignores everything (the default)."""

    wanted_events: frozenset[Event] = frozenset()

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        return None


#: Events that are normal operation and frequent: logged at DEBUG by `LoggingHook`.
_QUIET = frozenset(
    {
        Event.RECORD_HANDLED,
        Event.RECORDS_HANDLED,
        Event.PARTITION_PAUSED,
        Event.PARTITION_RESUMED,
        Event.OFFSETS_COMMITTED,
        Event.RECORDS_ACKNOWLEDGED,
        Event.RETRY_SCHEDULED,
        Event.RETRIES_SCHEDULED,
        Event.RECORD_FAILED,
        Event.RECORDS_FAILED,
        Event.KEY_ORDER_BLOCKED,
        Event.KEY_ORDER_RELEASED,
        Event.KEY_ORDER_FOLLOWED,
        Event.FLOOD_GUARD_REFUSED,
    }
)
_LOUD = frozenset(
    {
        Event.FLOOD_GUARD_OPENED,
        Event.PUBLISH_FAILED,
        Event.PRODUCER_RECREATED,
        Event.TRANSACTION_ABORTED,
        Event.KEY_STATE_REFUSED,
    }
)


class LoggingHook:
    """Logs events: pausing and handling at DEBUG, trouble at WARNING, the rest at INFO."""

    wanted_events = PER_BATCH
    summed_events = SUMMED

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("retrytopics")

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        level = logging.DEBUG if event in _QUIET else logging.WARNING if event in _LOUD else logging.INFO
        if self.logger.isEnabledFor(level):
            text = " ".join(f"{k}={v}" for k, v in data.items())
            # the fields travel as data too, so that JSON log lines carry them as keys (retrytopics.operator.logs)
            self.logger.log(level, "%s %s", event.value, text, extra={"event": event.value, "event_fields": dict(data)})


@dataclass(frozen=True, slots=True, kw_only=True)
class Stats:
    """Counters since the app started (`RetryApp.stats`)."""

    handled: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    duplicates_suppressed: int = 0
    publish_failures: int = 0
    abandoned: int = 0
    transactions_aborted: int = 0
    paused_partitions: int = 0
    #: share consumers: acknowledgements by type (accepted, released, rejected, renewed)
    acknowledged: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


#: the acknowledgement counts a `records.acknowledged` event carries
_ACK_KINDS = ("accepted", "released", "rejected", "renewed")


class StatsCollector:
    """A hook that counts events; thread-safe, since every consumer thread emits."""

    wanted_events = PER_BATCH
    summed_events = SUMMED
    _COUNTED: ClassVar[dict[Event, str]] = {
        Event.RECORDS_HANDLED: "handled",
        Event.RECORDS_FAILED: "failed",
        Event.RECORD_FAILED: "failed",
        Event.RETRIES_SCHEDULED: "retried",
        Event.RETRY_SCHEDULED: "retried",
        Event.DUPLICATE_SUPPRESSED: "duplicates_suppressed",
        Event.PUBLISH_FAILED: "publish_failures",
        Event.RECORD_ABANDONED: "abandoned",
        Event.TRANSACTION_ABORTED: "transactions_aborted",
    }

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # a plain dict with every name: each failure is counted here, and a dict's item access is quicker
        # than a Counter's (a subclass)
        self._counts: dict[str, int] = dict.fromkeys(self._COUNTED.values(), 0)
        self._dead: Counter[str] = Counter()
        self._acks: Counter[str] = Counter()

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        name = self._COUNTED.get(event)
        if name is not None:
            count = data.get("count", 1)
            with self._lock:
                self._counts[name] += count if isinstance(count, int) else 1
        elif event is Event.DLQ_DISPATCHED:
            reason = str(data.get("reason"))
            with self._lock:
                self._dead[reason] += 1
        elif event is Event.RECORDS_ACKNOWLEDGED:
            with self._lock:
                for kind in _ACK_KINDS:
                    count = data.get(kind)
                    self._acks[kind] += count if isinstance(count, int) else 0

    def snapshot(self, *, paused_partitions: int = 0) -> Stats:
        with self._lock:
            return Stats(
                dead_lettered=MappingProxyType(dict(self._dead)),
                acknowledged=MappingProxyType({k: v for k, v in self._acks.items() if v}),
                paused_partitions=paused_partitions,
                **{name: self._counts[name] for name in self._COUNTED.values()},
            )


def _events(hook: Hook, name: str, otherwise: frozenset[Event]) -> frozenset[Event]:
    """The hook's attribute `name` when that is a set of `Event`s, else `otherwise` (an attribute of that name
    that is something else belongs to the hook's own business, not to us)."""
    events = getattr(hook, name, None)
    if isinstance(events, set | frozenset) and all(isinstance(e, Event) for e in events):
        return frozenset(events)
    return otherwise


def _wanted(hook: Hook) -> frozenset[Event]:
    """The events `hook` receives: its `wanted_events`, else every one."""
    return _events(hook, "wanted_events", frozenset(Event))


def _each_wanted(hook: Hook) -> frozenset[Event]:
    """The per-record failure events `hook` wants one by one: those it wants and does not count from sums."""
    return (_wanted(hook) & SUMMED) - _events(hook, "summed_events", frozenset())


class Emitter:
    """Fans an event out to the hooks that want it; a failing hook is logged, never propagated."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self._hooks: list[Hook] = []
        self._routes: dict[Event, tuple[Hook, ...]] = {}
        self._each: dict[Event, tuple[Hook, ...]] = {}
        for hook in hooks:
            self.add(hook)

    @property
    def hooks(self) -> tuple[Hook, ...]:
        return tuple(self._hooks)

    def add(self, hook: Hook) -> None:
        self._hooks.append(hook)
        self._routes = {event: tuple(h for h in self._hooks if event in _wanted(h)) for event in Event}
        self._each = {event: tuple(h for h in self._hooks if event in _each_wanted(h)) for event in SUMMED}

    def wants(self, event: Event) -> bool:
        """Whether any hook receives `event` (so that a caller can skip building a frequent one)."""
        return bool(self._routes.get(event))

    def wants_each(self, event: Event) -> bool:
        """Whether any hook wants a per-record failure event (`SUMMED`) one by one rather than summed."""
        return bool(self._each.get(event))

    def emit_each(self, event: Event, **data: object) -> None:
        """A per-record failure event (`SUMMED`), to the hooks that do not count it from its sum."""
        hooks = self._each.get(event)
        if hooks:
            self._deliver(hooks, event, data)

    def emit(self, event: Event, **data: object) -> None:
        hooks = self._routes.get(event)
        if hooks:
            self._deliver(hooks, event, data)

    @staticmethod
    def _deliver(hooks: tuple[Hook, ...], event: Event, data: dict[str, object]) -> None:
        view = MappingProxyType(data)
        for hook in hooks:
            try:
                hook.on_event(event, view)
            except Exception:
                log.exception("hook %r failed on %s", hook, event.value)
