"""`RetryApp`: decorate handlers, provision their topics, run main and tier consumers.

::

    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9092"), group="billing")

    @app.handler("orders", policy=RetryPolicy(delays=["5s", "30s", "5m"], non_retryable=[ValueError]),
                 value_deserializer=json_value)
    def charge(record: Record[dict]) -> None:
        ...                              # raise to retry; `raise NonRetryable(exc)` to dead-letter at once

    app.provision()                      # tier topics and the DLQ, as many partitions as "orders" has
    app.run()                            # main consumer; blocks until SIGTERM/SIGINT or app.stop()
    # elsewhere, or in the same process:   app.run_tiers()   /   app.run_tiers(tiers=["30s"])

The decorated function is returned unchanged: call it directly in unit tests (`retrytopics.testing` builds
Records). Handlers run one record at a time in their consumer's thread; `async def` handlers run on an event
loop owned by that consumer. The guarantees are at-least-once: a handler may see a record again after a
crash, so side effects should be idempotent on `record.origin_message_id` (or use `exactly_once=True`
for the hand-off between topics).
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from retrytopics.client_factory import ClientFactory, KafkaClientFactory
from retrytopics.connectors.admin import (
    ProvisionOutcome,
    TopicSpec,
    key_state_problem,
    key_state_spec,
    less_durable,
    replication_config,
    share_group_provisioning,
)
from retrytopics.connectors.clients import DEFAULT_MAX_POLL_INTERVAL_MS, DEFAULT_SESSION_TIMEOUT_MS
from retrytopics.connectors.config import KafkaConfig, check_replication, validate_overrides
from retrytopics.connectors.serde import Deserializer, bytes_value
from retrytopics.core.concurrency import Concurrency
from retrytopics.core.dedupe import DEFAULT_CAPACITY, DuplicateAudit
from retrytopics.core.durations import DurationLike, parse_duration
from retrytopics.core.errors import ConfigError, KafkaClientError
from retrytopics.core.flood_guard import FloodGuard
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.core.naming import NamingStrategy, TopicSet, validate_topic_name
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.redaction import Redactor
from retrytopics.core.signing import HeaderKeys, KeyLike
from retrytopics.core.transactions import (
    CALL_TIMEOUT_MS,
    EXACTLY_ONCE_MAX_POLL_INTERVAL_MS,
    default_instance_id,
    transaction_timeout_ms,
)
from retrytopics.observe.events import Emitter, Hook, LoggingHook, Stats, StatsCollector
from retrytopics.registry import Registration, Registry
from retrytopics.runtime.consumer.lifecycle import Loop, Runner
from retrytopics.runtime.consumer.loop import ConsumerLoop, LoopClients
from retrytopics.runtime.consumer.settings import TIER_CONSUMER_DEFAULTS, LoopSettings, main_settings, tier_settings
from retrytopics.runtime.consumer.share_loop import ShareConsumerLoop
from retrytopics.runtime.flood.board import GuardBoard, process_name
from retrytopics.runtime.flood.breaker import HandlerGuard
from retrytopics.runtime.handoff.handoff import DeadLetterCallback
from retrytopics.runtime.handoff.publish import ALONE_OVERRIDES
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.duplicates import verified_tails

__all__ = ["RetryApp"]

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("retrytopics.app")

TierSelection = str | Sequence[str]

#: the main consumer's models (`RetryApp(consumer=...)`)
_CONSUMER_MODELS = ("group", "share")


class RetryApp:
    """Handlers, their retry policies and topics, and the consumers that run them (see the module docstring).

    `consumer_overrides`/`producer_overrides` are librdkafka properties for this app's clients (e.g.
    `{"session.timeout.ms": 10000}`). `exactly_once=True` republishes and commits each batch in one Kafka
    transaction (consumers read_committed). `on_dead_letter(record, route)` runs after each acknowledged
    DLQ publish. `id_header` names a user header holding a message id (else `<topic>-<partition>-<offset>`).
    `instance_id` names this process in transactional ids (`<consumer group>-<instance_id>`); by default
    `RETRYTOPICS_INSTANCE_ID`, else `HOSTNAME` (a container's or pod's name), else random. A restart with
    the same id fences its crashed predecessor's open transaction at once, instead of leaving it to time out
    (retrytopics/core/transactions.py). A tier record due within `wait_in_memory`
    (default 1 s; "0s": never) waits in the tier consumer's memory, at most `wait_in_memory_records` per
    partition, instead of being fetched again when due (see runtime/waiting.py); longer waits happen in Kafka.
    `redact_patterns` (regular expressions) hide more than the built-in secret forms in the exception
    headers of tier and DLQ records: the whole match, or its `secret` group (see retrytopics/core/redaction.py).
    At-least-once, a consumer commits as soon as hand-offs are acknowledged (`commit_on_ack`), and when
    partitions are assigned it reads the last `dedupe_seed` records (default 1000; 0: off) of every partition
    of their tiers and DLQ, for at most 5 s, so that a record a previous owner handed off without committing
    it is suppressed, not handled and handed off again (see retrytopics/runtime/records/duplicates.py).
    `header_key` (str or bytes, at least 32 bytes; or a list for rotation: the first signs, any verifies) signs
    the retry headers of every tier and DLQ record with an HMAC (`retry.signature`); tier records whose
    signature is missing or wrong are dead-lettered as `invalid_retry_headers`, and only verified records seed
    the duplicate check, so a principal with WRITE on a tier or the DLQ cannot forge retry state
    (docs/headers.md, *Trust*). The key never appears in a repr, log line or error.
    `clients` is where every consumer, producer, tail read and `provision()` step comes from (default: Kafka
    clients for `kafka`, made at each `start`/`provision`); `clients=MemoryClientFactory(broker)` runs the
    whole app on the in-memory broker, for fast tests (`retrytopics.testing`).
    `consumer="share"` makes the main consumer a member of a share group named `group` (Kafka queues, KIP-932:
    any number of consumers on one partition, each record acknowledged on its own; docs/share-groups.md), for
    every handled topic: one app, one main consumer, and Kafka keeps a group id to one kind of group. Tier
    consumers stay consumer-group members (a tier waits by pausing partitions until a record is due; a share
    group has none to pause). Not with `exactly_once=True`: acknowledgements are not part of a transaction.
    """

    def __init__(
        self,
        *,
        kafka: KafkaConfig,
        group: str,
        consumer_overrides: Mapping[str, str | int | float | bool] | None = None,
        producer_overrides: Mapping[str, str | int | float | bool] | None = None,
        exactly_once: bool = False,
        naming: NamingStrategy = NamingStrategy.BY_DELAY,
        id_header: str | None = None,
        hooks: Sequence[Hook] = (),
        on_dead_letter: DeadLetterCallback | None = None,
        batch_size: int = 500,
        commit_every: int = 500,
        commit_interval: DurationLike = "1s",
        dedupe_capacity: int = DEFAULT_CAPACITY,
        dedupe_seed: int = 1000,
        commit_on_ack: bool = True,
        instance_id: str | None = None,
        wait_in_memory: DurationLike = "1s",
        wait_in_memory_records: int = 2000,
        redact_patterns: Sequence[str | re.Pattern[str]] = (),
        header_key: KeyLike | HeaderKeys | None = None,
        clients: ClientFactory | None = None,
        consumer: str = "group",
    ) -> None:
        if not isinstance(kafka, KafkaConfig):
            raise ConfigError("kafka", kafka, "expected a KafkaConfig")
        self.kafka = kafka
        self.group = validate_topic_name(group, field="group")
        self.consumer_overrides = dict(consumer_overrides or {})
        self.producer_overrides = dict(producer_overrides or {})
        # refused here, at construction, as KafkaConfig's own tables are: not later in a consumer thread
        validate_overrides("consumer_overrides", self.consumer_overrides, allow_insecure=kafka.allow_insecure)
        validate_overrides("producer_overrides", self.producer_overrides, allow_insecure=kafka.allow_insecure)
        self.exactly_once = bool(exactly_once)
        self.consumer = consumer  # checked against exactly_once (the property)
        self.naming = NamingStrategy(naming)
        self.id_header = id_header
        self.on_dead_letter = on_dead_letter
        self._clients = clients
        self._header_keys = None if header_key is None else HeaderKeys.of(header_key, field="header_key")
        self._registry = Registry(
            group=self.group,
            naming=self.naming,
            id_header=id_header,
            redact=Redactor.with_patterns(redact_patterns),
            header_keys=self._header_keys,
        )
        self._loop_defaults, self._tier_defaults = _loop_options(
            batch_size=batch_size,
            commit_every=commit_every,
            commit_interval=commit_interval,
            commit_on_ack=commit_on_ack,
            dedupe_capacity=dedupe_capacity,
            dedupe_seed=dedupe_seed,
            wait_in_memory=wait_in_memory,
            wait_in_memory_records=wait_in_memory_records,
        )
        self._dedupe_capacity = dedupe_capacity
        self.instance_id = instance_id or default_instance_id(os.environ, lambda: uuid.uuid4().hex[:12])
        self._eos = _exactly_once_overrides(self) if self.exactly_once else ({}, {})
        self._stats = StatsCollector()
        self._emitter = Emitter([self._stats, LoggingHook(), *hooks])
        self._runner = Runner(threading.Event())
        #: the retry-flood guards of this process's handlers (source topic -> guard), made by `start`
        self._flood_guards: dict[str, HandlerGuard] = {}
        self._guard_board: GuardBoard | None = None

    @property
    def consumer(self) -> str:
        """The main consumer's model: "group" (a consumer group, the default) or "share" (a share group)."""
        return self._consumer

    @consumer.setter
    def consumer(self, model: str) -> None:
        if model not in _CONSUMER_MODELS:
            raise ConfigError("consumer", model, f"expected one of {list(_CONSUMER_MODELS)}")
        if model == "share" and self.exactly_once:
            raise ConfigError(
                "exactly_once",
                True,
                "not available with consumer='share': a share group's acknowledgements are not part of a Kafka "
                "transaction (the guarantee is at least once)",
            )
        self._consumer = model

    # -- registration ----------------------------------------------------------------------------------------

    def handler(
        self,
        topic: str,
        *,
        policy: RetryPolicy | None = None,
        value_deserializer: Deserializer = bytes_value,
        dlq: str | None = None,
        handler_budget: DurationLike = "1s",
        ordering: KeyOrdering | None = None,
        flood_guard: FloodGuard | None = None,
        concurrency: int | Concurrency = 1,
    ) -> Callable[[F], F]:
        """Register a handler for `topic`; returns the function unchanged (still a plain callable).

        `handler_budget` is the longest one call of the handler may take. With `policy.in_process` retries,
        `attempts x (wait + handler_budget)` must stay below the consumer's `max.poll.interval.ms`, or a
        record retried in-process would get this consumer evicted from its group: that is checked here, and
        a `ConfigError` naming `in_process` says by how much.

        `ordering=KeyOrdering(...)` declares key-ordered retries (docs/key-ordering.md): a record is never
        handled before every earlier record of its key (same source partition) is handled or dead-lettered,
        in both delivery modes. It is checked here, and `start`/`run` refuse it with `consumer="share"` (a
        `ConfigError` naming `ordering`: a share group has no partition order to keep). It needs the
        key-state topic (`provision()`); with `header_key` the key-state records are signed too.

        `flood_guard=FloodGuard(...)` stops calling the handler while its dependency is down (docs/flood-guard.md):
        its consumers hold its partitions, probe one call at a time after a growing back-off, and a record that
        runs out of attempts meanwhile is not dead-lettered. One guard per handler per process. With key
        `ordering`, key order decides first and the guard admits only the calls (docs/flood-guard.md, "Key
        ordering"). Not yet with `consumer="share"` (a `ConfigError` naming `flood_guard`).

        `concurrency=200` (or `Concurrency(calls=200, max_bytes=..., order=OrderMode.KEY)`) keeps up to 200
        calls in flight in each consumer (docs/concurrency.md): `async def` handlers as tasks on an event loop,
        plain ones on a thread pool of that size. By default two records of one key and partition are never in
        flight together and start in offset order; `OrderMode.PARTITION` runs one at a time per partition,
        `OrderMode.NONE` keeps no order. Offsets are committed only below every unfinished record, and a
        failure goes to its tier while the other calls run. The default 1 is one call at a time on the
        consumer's thread. With key `ordering`, a key's records follow a failed one through the tiers as
        without concurrency (not with `OrderMode.NONE`). Not yet with a `flood_guard`, `exactly_once` nor
        `consumer="share"` (a `ConfigError` naming `concurrency`).
        """
        return self._register(
            topic,
            policy,
            value_deserializer,
            dlq,
            handler_budget,
            batch=False,
            ordering=ordering,
            flood_guard=flood_guard,
            concurrency=concurrency,
        )

    def batch_handler(
        self,
        topic: str,
        *,
        policy: RetryPolicy | None = None,
        value_deserializer: Deserializer = bytes_value,
        dlq: str | None = None,
        ordering: KeyOrdering | None = None,
        flood_guard: FloodGuard | None = None,
    ) -> Callable[[F], F]:
        """Register a batch handler for `topic`: it takes a list of Records, the records of one poll of one
        partition, in offset order (at most the consumer's batch size, 500 by default), on the source topic
        and on every tier. Every record it does not name in a raised `BatchFailed` succeeded; any other
        exception fails them all. Failed records follow `policy` one by one, exactly as a single handler's
        would (tiers, DLQ, `Retry`, `NonRetryable`), and a partition's offsets are committed over the
        records whose outcome is settled (succeeded, or republished and acknowledged), never past one that
        is not. The whole call must end within `max.poll.interval.ms`. `policy.in_process` retries are per
        record and not offered here: a failed record goes to the tiers (docs/architecture.md, "Batch
        handlers"). With key `ordering`, a call never holds two records of one key: it is cut before the
        second, which is admitted again once the call settled (docs/key-ordering.md, section 8). With
        `flood_guard=FloodGuard(...)` (as for `handler`), each call is admitted by the guard, and while the guard
        is not closed a call holds one record (docs/flood-guard.md, "Batch handlers"); not yet together with
        key `ordering` (a `ConfigError` naming `flood_guard`)."""
        return self._register(
            topic, policy, value_deserializer, dlq, "1s", batch=True, ordering=ordering, flood_guard=flood_guard
        )

    def _register(
        self,
        topic: str,
        policy: RetryPolicy | None,
        value_deserializer: Deserializer,
        dlq: str | None,
        handler_budget: DurationLike,
        *,
        batch: bool,
        ordering: KeyOrdering | None,
        flood_guard: FloodGuard | None = None,
        concurrency: int | Concurrency = 1,
    ) -> Callable[[F], F]:
        wanted = Registration(
            topic=topic,
            policy=policy,
            value_deserializer=value_deserializer,
            dlq=dlq,
            handler_budget=handler_budget,
            batch=batch,
            ordering=ordering,
            flood_guard=flood_guard,
            concurrency=concurrency,
        )
        bind = self._registry.add(wanted, lambda: self.max_poll_interval_ms)

        def register(fn: F) -> F:
            bind(fn)
            return fn

        return register

    def set_concurrency(self, concurrency: int | Concurrency, *, topic: str | None = None) -> None:
        """Set `concurrency` (as `handler(..., concurrency=)`) of `topic`'s handler, or of every handler; before
        `start`/`run`. `retrytopics run --concurrency N` and `[app] concurrency` call it. Checked as at
        registration: a `ConfigError` naming `concurrency`."""
        self._registry.set_concurrency(concurrency, topic=topic)

    def add_hook(self, hook: Hook) -> None:
        """Subscribe one more hook to this app's events (e.g. metrics set up after the app was built);
        call it before `start`/`run`."""
        self._emitter.add(hook)

    @property
    def max_poll_interval_ms(self) -> int:
        """The consumers' `max.poll.interval.ms`: librdkafka's default, or for exactly-once 20 s or the session
        timeout if longer (librdkafka refuses a poll interval below it), unless overridden."""
        config = {**self.kafka.consumer_config(), **self.consumer_overrides}
        default = DEFAULT_MAX_POLL_INTERVAL_MS
        if self.exactly_once:
            default = max(
                EXACTLY_ONCE_MAX_POLL_INTERVAL_MS, _ms(config, "session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS)
            )
        return _ms(config, "max.poll.interval.ms", default)

    @property
    def handlers(self) -> Mapping[str, Binding]:
        """Source topic → its handler binding (handler, policy, topics)."""
        return self._registry.bindings

    def topics(self, topic: str) -> TopicSet:
        """The tier topics and DLQ of a handled source topic."""
        return self._registry.get(topic).ctx.topics

    # -- provisioning ----------------------------------------------------------------------------------------

    def provision(
        self,
        *,
        partitions: int | None = None,
        replication_factor: int = -1,
        min_insync_replicas: int | None = None,
        timeout: DurationLike = "30s",
        broker_dlq: bool = True,
    ) -> dict[str, ProvisionOutcome]:
        """Create the tier topics and DLQs that are missing (never the source topics), with the source's
        partition count unless `partitions` is given (keyless records keep their partition; an existing topic
        with another count is a `TopicMismatchError`), `replication_factor` copies and `min_insync_replicas`
        (-1 and None: the broker's defaults). Logs a WARNING per tier or DLQ less durable than its source.

        With `consumer="share"`, the share group starts at the earliest record and, unless `broker_dlq=False`,
        gets the broker's own DLQ (Kafka 4.4+, KIP-1191) as a safety net: topic `dlq.<group>` and the group
        configs naming it (`connectors.admin.share_group_provisioning`). Idempotent."""
        clients = self._client_factory()
        timeout_s = parse_duration(timeout, field="timeout") / 1000
        specs = _tier_specs(
            self._registry.bindings, clients, partitions, (replication_factor, min_insync_replicas), timeout_s
        )
        share = self.consumer == "share"
        share_specs, share_config = share_group_provisioning(
            self.group,
            broker_dlq=share and broker_dlq,
            replication_factor=replication_factor,
            config=replication_config(min_insync_replicas),
        )
        specs += _flood_guard_specs(self._registry, replication_factor, min_insync_replicas)
        outcome = clients.ensure_topics([*specs, *share_specs], timeout_s)
        _warn_less_durable(self._registry.bindings, clients, timeout_s)
        if share:
            clients.set_share_group_config(self.group, share_config, timeout_s)
        return outcome

    def preflight(self, *, timeout: DurationLike = "30s") -> None:
        """Fail now, naming the topic and the fix, if a key-ordered handler's key-state topic is missing, not
        compacted or has fewer partitions than its source (`connectors.admin.key_state_problem`): run
        without it, a new owner of a partition could not know which keys are blocked. `start` calls it; an
        app without ordered handlers asks the broker nothing."""
        ordered = {topic: b for topic, b in self._registry.bindings.items() if b.ordering is not None}
        if not ordered:
            return
        clients = self._client_factory()
        timeout_s = parse_duration(timeout, field="timeout") / 1000
        names = [b.ctx.topics.key_state_topic for b in ordered.values()]
        durability = clients.topic_durability(names, timeout_s)
        for topic, binding in ordered.items():
            name = binding.ctx.topics.key_state_topic
            problem = key_state_problem(
                binding.ctx.topics,
                clients.partition_count(topic, timeout_s) or 0,
                durability.get(name),
                clients.partition_count(name, timeout_s),
            )
            if problem is not None:
                raise ConfigError("key_state_topic", name, problem)

    # -- running ---------------------------------------------------------------------------------------------

    def start(self, *, main: bool = True, tiers: TierSelection | None = None) -> None:
        """Start consumers in background threads and return (see `run` / `run_tiers` for blocking forms)."""
        if not self._registry.bindings:
            raise ConfigError("handlers", [], "no handler registered; decorate one with @app.handler(topic)")
        if self._runner.stop_event.is_set():
            raise ConfigError("app", "stopped", "a stopped RetryApp cannot be restarted; build a new one")
        _refuse_key_ordering(self)
        if self._registry.flood_guards and self.consumer == "share":
            raise ConfigError("flood_guard", sorted(self._registry.flood_guards), "not with consumer='share' yet")
        _refuse_concurrency(self)
        self.preflight()
        settings: list[LoopSettings] = []
        if main:
            settings.append(
                main_settings(
                    self.group, list(self._registry.bindings), **self._loop_defaults, exactly_once=self.exactly_once
                )
            )
        if tiers is not None:
            settings += tier_settings(
                self._registry.bindings,
                tiers,
                **self._loop_defaults,
                **self._tier_defaults,
                exactly_once=self.exactly_once,
            )
        _claim_transactional_ids(self, settings)
        clients = self._client_factory()
        # one breaker per guarded handler in this process, shared by its main and tier consumers
        self._flood_guards = {
            topic: HandlerGuard(topic, config, emitter=self._emitter, clock=clients.clock, rng=random.Random())
            for topic, config in self._registry.flood_guards.items()
        }
        if self._flood_guards:
            self._guard_board = self._flood_guard_board(clients)
        self._runner.start([self._loop(s, clients) for s in settings])

    def _flood_guard_board(self, clients: ClientFactory) -> GuardBoard:
        """The thread that reports this process's guards and applies an operator's commands to them, started
        (runtime/flood/board.py); a flood-guard topic it cannot read fails the start."""
        board = GuardBoard(
            self._flood_guards,
            {t: self._registry.bindings[t].ctx.topics.flood_guard_topic for t in self._flood_guards},
            process=process_name(self.instance_id),
            producer=lambda: clients.producer(None, self.producer_overrides),
            feed=clients.key_state_feed,
            read=clients.read_to_end,
            keys=self._header_keys,
            wall_ms=clients.clock.now_ms,
            stop=self._runner.stop_event,
        )
        board.start(CALL_TIMEOUT_MS / 1000)
        return board

    def _client_factory(self) -> ClientFactory:
        # made when used, not when the app is built: the CLI sets `kafka` on a loaded app before running it
        return KafkaClientFactory(self.kafka) if self._clients is None else self._clients

    def _loop(self, settings: LoopSettings, clients: ClientFactory) -> Loop:
        bindings = self._registry.for_topics(settings.topics)
        is_tier = settings.group_id != self.group
        if not is_tier and self.consumer == "share":
            return self._share_loop(settings, bindings, clients)
        overrides = {**(TIER_CONSUMER_DEFAULTS if is_tier else {}), **self.consumer_overrides, **self._eos[0]}
        producer_overrides = {**self.producer_overrides, **self._eos[1]}
        transactional_id = _transactional_id(settings, self.instance_id) if self.exactly_once else None
        loop_clients = LoopClients(
            consumer=lambda: clients.consumer(settings.group_id, overrides),
            producer=lambda: clients.producer(transactional_id, producer_overrides),
            alone_producer=lambda: clients.producer(None, {**self.producer_overrides, **ALONE_OVERRIDES}),
            tail_reader=verified_tails(clients.read_tails, self._header_keys),
            key_state_reader=clients.read_to_end,
            key_state_feed=clients.key_state_feed,
            end_offsets=clients.end_offsets,
        )
        return ConsumerLoop(
            settings,
            bindings,
            clients=loop_clients,
            emitter=self._emitter,
            stop=self._runner.stop_event,
            audit=DuplicateAudit(self._dedupe_capacity),
            on_dead_letter=self.on_dead_letter,
            clock=clients.clock,
            flood_guards={t: g for t, g in self._flood_guards.items() if t in {b.topic for b in bindings.values()}},
        )

    def _share_loop(self, settings: LoopSettings, bindings: Mapping[str, Binding], clients: ClientFactory) -> Loop:
        timeout_s = CALL_TIMEOUT_MS / 1000
        return ShareConsumerLoop(
            settings,
            bindings,
            # a poll takes at most `batch_size` records: with a slow handler, small batches spread the work
            consumer_factory=lambda: clients.share_consumer(
                settings.group_id, {"max.poll.records": settings.batch_size, **self.consumer_overrides}
            ),
            producer_factory=lambda: clients.producer(None, self.producer_overrides),
            alone_producer_factory=lambda: clients.producer(None, {**self.producer_overrides, **ALONE_OVERRIDES}),
            group_config=lambda: clients.share_group_config(settings.group_id, timeout_s),
            emitter=self._emitter,
            stop=self._runner.stop_event,
            audit=DuplicateAudit(self._dedupe_capacity),
            on_dead_letter=self.on_dead_letter,
            clock=clients.clock,
        )

    def run(self) -> None:
        """Run the main consumer (all handled topics) until SIGTERM/SIGINT or `stop()`; blocks."""
        self.start(main=True)
        self._runner.run_until_stopped()

    def run_tiers(self, tiers: TierSelection = "all") -> None:
        """Run tier consumers until SIGTERM/SIGINT or `stop()`; blocks. Each tier topic gets its own consumer
        group and thread. `tiers` is "all", or delays (`["30s"]`) or tier topic names."""
        self.start(main=False, tiers=tiers)
        self._runner.run_until_stopped()

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Stop every consumer cleanly (finish the current record, drain, commit, leave the group)."""
        stopped = self._runner.stop(timeout)
        if self._guard_board is not None:  # its last reports say this process left
            self._guard_board.join(timeout)
        return stopped

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every consumer has stopped; True if they have."""
        return self._runner.join(timeout)

    @property
    def flood_guards(self) -> Mapping[str, FloodGuard]:
        """Source topic -> the retry-flood guard of its handler, for the handlers that have one."""
        return self._registry.flood_guards

    @property
    def error(self) -> BaseException | None:
        """What stopped the app: a handler's BaseException (e.g. KeyboardInterrupt) or an unexpected error."""
        return self._runner.crash

    @property
    def running(self) -> bool:
        return any(loop.running for loop in self._runner.loops)

    @property
    def healthy(self) -> bool:
        """False while a publish is failing (e.g. the DLQ is unreachable) or after a consumer crashed."""
        return all(loop.healthy for loop in self._runner.loops)

    @property
    def stats(self) -> Stats:
        """Counters since start: handled, retried, dead-lettered by reason, duplicates suppressed, paused partitions."""
        return self._stats.snapshot(paused_partitions=sum(loop.paused_partitions for loop in self._runner.loops))


#: the transactional ids of this process's running exactly-once consumers, and the runner of each
_claimed_ids: dict[str, Runner] = {}
_claimed_lock = threading.Lock()


def _ms(config: Mapping[str, Any], name: str, default: int) -> int:
    value = config.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "expected a number of ms") from None


def _transactional_id(settings: LoopSettings, instance_id: str) -> str:
    return f"{settings.group_id}-{instance_id}"


def _exactly_once_overrides(app: RetryApp) -> tuple[dict[str, Any], dict[str, Any]]:
    """The consumer and producer settings that bound an open transaction (retrytopics/core/transactions.py)."""
    poll_ms = app.max_poll_interval_ms
    timeout_ms = transaction_timeout_ms(poll_ms, {**app.kafka.producer_config(), **app.producer_overrides})
    return {"max.poll.interval.ms": poll_ms}, {"transaction.timeout.ms": timeout_ms}


def _claim_transactional_ids(app: RetryApp, settings: list[LoopSettings]) -> None:
    """Refuse to start an exactly-once consumer whose transactional id another running app of this process
    uses: the two producers would fence each other at every transaction."""
    if not app.exactly_once:
        return
    ids = [_transactional_id(s, app.instance_id) for s in settings]
    with _claimed_lock:
        for transactional_id in ids:
            owner = _claimed_ids.get(transactional_id)
            if owner is not None and owner is not app._runner and not owner.join(0):
                raise ConfigError(
                    "instance_id",
                    app.instance_id,
                    f"another RetryApp of this process runs the consumer with transactional id "
                    f"{transactional_id!r}; give each app its own instance_id",
                )
        _claimed_ids.update(dict.fromkeys(ids, app._runner))


def _tier_specs(
    bindings: Mapping[str, Binding],
    clients: ClientFactory,
    partitions: int | None,
    replication: tuple[int, int | None],
    timeout_s: float,
) -> list[TopicSpec]:
    """The tier and DLQ topics of every registered source, with the source's partition count unless
    `partitions` is given; `replication` is (replication factor, min.insync.replicas), checked first."""
    replication_factor, min_insync_replicas = replication
    check_replication(replication_factor, min_insync_replicas, field="provision")
    config = replication_config(min_insync_replicas)
    specs: list[TopicSpec] = []
    for topic, binding in bindings.items():
        count = partitions or clients.partition_count(topic, timeout_s)
        if count is None:
            raise ConfigError("topic", topic, "the source topic does not exist; create it, or pass partitions=")
        specs += [
            TopicSpec(name=name, partitions=count, replication_factor=replication_factor, config=config)
            for name in binding.ctx.topics.all_topics
        ]
        if binding.ordering is not None:
            specs.append(key_state_spec(binding.ctx.topics, count, replication_factor, config))
    return specs


def _flood_guard_specs(registry: Registry, replication_factor: int, min_insync_replicas: int | None) -> list[TopicSpec]:
    """The flood-guard topic of every guarded handler (docs/flood-guard.md): compacted, one partition (a few
    records per process and handler), the tiers' replication."""
    config = {**replication_config(min_insync_replicas), "cleanup.policy": "compact"}
    names = {registry.bindings[t].ctx.topics.flood_guard_topic for t in registry.flood_guards}
    return [
        TopicSpec(name=n, partitions=1, replication_factor=replication_factor, config=config) for n in sorted(names)
    ]


def _warn_less_durable(bindings: Mapping[str, Binding], clients: ClientFactory, timeout_s: float) -> None:
    for topic, binding in bindings.items():
        try:
            durability = clients.topic_durability([topic, *binding.ctx.topics.all_topics], timeout_s)
        except KafkaClientError as exc:  # advice only: a broker that will not describe configs provisions the same
            log.debug("replication of %s's topics not compared: %s", topic, exc)
            continue
        for warning in less_durable(topic, durability):
            log.warning("%s", warning)


def _loop_options(
    *,
    batch_size: int,
    commit_every: int,
    commit_interval: DurationLike,
    commit_on_ack: bool,
    dedupe_capacity: int,
    dedupe_seed: int,
    wait_in_memory: DurationLike,
    wait_in_memory_records: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checked LoopSettings fields of every consumer, and those only tier consumers use."""
    for name, value in (
        ("batch_size", batch_size),
        ("commit_every", commit_every),
        ("dedupe_capacity", dedupe_capacity),
        ("wait_in_memory_records", wait_in_memory_records),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(name, value, "expected an int >= 1")
    if isinstance(dedupe_seed, bool) or not isinstance(dedupe_seed, int) or dedupe_seed < 0:
        raise ConfigError("dedupe_seed", dedupe_seed, "expected an int >= 0 (0: no seeding)")
    every = {
        "batch_size": batch_size,
        "commit_every": commit_every,
        "commit_interval_ms": max(1, parse_duration(commit_interval, field="commit_interval")),
        "commit_on_ack": bool(commit_on_ack),
        "seed_last": dedupe_seed,
    }
    tiers = {
        "wait_in_memory_ms": parse_duration(wait_in_memory, field="wait_in_memory"),
        "wait_in_memory_records": wait_in_memory_records,
    }
    return every, tiers


def _refuse_concurrency(app: RetryApp) -> None:
    # not yet: a transaction closing over settled records only, and a share consumer acknowledging each call
    # as it settles (docs/concurrency.md, "Refused")
    windowed = sorted(topic for topic, binding in app.handlers.items() if binding.concurrency is not None)
    if not windowed:
        return
    if app.exactly_once:
        raise ConfigError("concurrency", windowed, "not with exactly_once yet")
    if app.consumer == "share":
        raise ConfigError("concurrency", windowed, "not with consumer='share' yet")
    # one consumer runs every handler of the app: its records stage is one kind
    if any(binding.ordering is not None and binding.concurrency is None for binding in app.handlers.values()):
        raise ConfigError("concurrency", windowed, "not in an app with a key-ordered handler without concurrency yet")
    if app._registry.flood_guards:
        raise ConfigError("concurrency", windowed, "not in an app with a flood-guarded handler yet")


def _refuse_key_ordering(app: RetryApp) -> None:
    # Enforced in both delivery modes, for handlers and batch handlers, with partition-based consumers
    # (docs/key-ordering.md, section 12); share groups have no partition order to keep.
    ordered = sorted(topic for topic, binding in app.handlers.items() if binding.ordering is not None)
    if not ordered:
        return
    if app.consumer == "share":
        raise ConfigError("ordering", ordered, "key ordering needs partition order: not with consumer='share'")
