"""Prometheus metrics, as a hook on the runtime's events (install the `metrics` extra).

    from retrytopics.observe.metrics import PrometheusHook
    metrics = PrometheusHook()
    metrics.serve(9102)                       # GET http://host:9102/metrics
    app = RetryApp(kafka=..., group="billing", hooks=[metrics])

Each hook owns its registry, so several apps in one process (or tests) never collide. Labels are bounded
by configuration (topics, tiers, reasons), never by record content.

`retrytopics run/tiers --metrics-port` also wires `track_health(lambda: app.healthy)` (the gauge
`retrytopics_healthy`) and `consumer_properties()` into the app's consumers (the gauge
`retrytopics_consumer_lag` per topic, from librdkafka's statistics). Both are read without a broker
request, so `/metrics` answers while the brokers are down.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from retrytopics.observe.events import PER_BATCH, SUMMED, Event

__all__ = ["DELIVERY_COUNT_BUCKETS", "LATENESS_BUCKETS_S", "STATISTICS_INTERVAL_MS", "PrometheusHook"]

log = logging.getLogger("retrytopics.metrics")

#: How often librdkafka reports consumer lag; a longer interval costs less JSON parsing on big assignments.
STATISTICS_INTERVAL_MS = 15_000

#: Lateness (handled_at - due_at) buckets, in seconds: the SLO is p99 <= 100 ms.
LATENESS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


#: Share-group delivery counts: Kafka bounds the limit to 2-10 (default 5).
DELIVERY_COUNT_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10)


_GUARD_EVENTS = frozenset(
    {
        Event.FLOOD_GUARD_OPENED,
        Event.FLOOD_GUARD_CLOSED,
        Event.FLOOD_GUARD_PROBED,
        Event.FLOOD_GUARD_REFUSED,
        Event.FLOOD_GUARD_DEFERRED,
    }
)


class PrometheusHook:
    """Counts records handled, failed, retried and dead-lettered per topic (and tier, reason), observes
    lateness, and tracks paused partitions and publish failures."""

    wanted_events = PER_BATCH | {Event.LAG_MEASURED}
    summed_events = SUMMED

    def __init__(self, registry: CollectorRegistry | None = None, *, failures_by_exception: bool = False) -> None:
        """`failures_by_exception`: also count failures by exception type (`retrytopics_handler_failures_total`);
        the loop then builds one `record.failed` event per failed record (the failure path only)."""
        if failures_by_exception:
            self.summed_events = SUMMED - {Event.RECORD_FAILED}
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.handled = Counter("retrytopics_records_handled", "Handler calls that returned", ["topic"], registry=r)
        self.failed = Counter("retrytopics_records_failed", "Handler calls that raised", ["topic"], registry=r)
        self.retried = Counter(
            "retrytopics_records_retried", "Republishes to a tier, acknowledged", ["topic", "tier_topic"], registry=r
        )
        self.dead_lettered = Counter(
            "retrytopics_records_dead_lettered", "DLQ publishes, acknowledged", ["topic", "reason"], registry=r
        )
        self.duplicates = Counter(
            "retrytopics_duplicates_suppressed", "Tier records skipped as already handled", ["topic"], registry=r
        )
        self.publish_failures = Counter(
            "retrytopics_publish_failures", "Republish or DLQ publish attempts that failed", ["topic"], registry=r
        )
        self.abandoned = Counter(
            "retrytopics_records_abandoned",
            "Records left to a new owner after losing a partition",
            ["topic"],
            registry=r,
        )
        self.lateness = Histogram(
            "retrytopics_lateness_seconds",
            "handled_at - due_at of retried records",
            ["topic"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )
        self.paused = Gauge("retrytopics_paused_partitions", "Partitions paused right now", ["topic"], registry=r)
        self.commits = Counter("retrytopics_commits", "Offset commits sent", ["consumer"], registry=r)
        self.acknowledgements = Counter(
            "retrytopics_share_acknowledgements",
            "Share-consumer acknowledgements by type (renewed stays 0: confluent-kafka 2.16 has no RENEW)",
            ["consumer", "type"],
            registry=r,
        )
        self.delivery_counts = Histogram(
            "retrytopics_share_delivery_count",
            "The delivery count of each record a share consumer received (1: first delivery)",
            ["consumer"],
            buckets=DELIVERY_COUNT_BUCKETS,
            registry=r,
        )
        self.acknowledgement_failures = Counter(
            "retrytopics_share_acknowledgement_failures",
            "Share-consumer acknowledgement commits the broker refused (the records come back)",
            ["consumer"],
            registry=r,
        )
        self.healthy = Gauge(
            "retrytopics_healthy", "1 while every consumer loop of the app is healthy (app.healthy), else 0", registry=r
        )
        self.lag = Gauge(
            "retrytopics_consumer_lag",
            "Records after the committed offset, summed over the assigned partitions "
            "(a tier's lag includes records waiting for their due time)",
            ["topic"],
            registry=r,
        )
        self.blocked_keys = Gauge(
            "retrytopics_key_order_blocked_keys",
            "Keys blocked (open chains) per source partition of a key-ordered handler, on its main consumer",
            ["topic", "partition"],
            registry=r,
        )
        self.followers = Counter(
            "retrytopics_key_order_followers",
            "Records of blocked keys handed off unhandled behind their predecessor",
            ["topic"],
            registry=r,
        )
        self.bound_reached = Counter(
            "retrytopics_key_order_bound_reached",
            "Source partitions paused at a key-order bound: max_blocked_keys, or parked records (once per episode)",
            ["topic"],
            registry=r,
        )
        self.unproven = Counter(
            "retrytopics_key_order_unproven",
            "Followers dead-lettered as blocked_by_key because nothing proved their predecessor's fate",
            ["topic"],
            registry=r,
        )
        self.key_state_refused = Counter(
            "retrytopics_key_state_refused",
            "Key-state records skipped as malformed or, with header_key, as unsigned or forged",
            ["topic", "reason"],
            registry=r,
        )
        self.guard_state = Gauge(
            "retrytopics_flood_guard_state",
            "A guarded handler's retry-flood guard in this process: 1 open or probing, 0 closed",
            ["handler"],
            registry=r,
        )
        self.guard_openings = Counter(
            "retrytopics_flood_guard_openings", "Times a retry-flood guard opened", ["handler", "reason"], registry=r
        )
        self.guard_probes = Counter(
            "retrytopics_flood_guard_probes",
            "Probe calls of a half-open retry-flood guard, by outcome",
            ["handler", "succeeded"],
            registry=r,
        )
        self.guard_open_seconds = Counter(
            "retrytopics_flood_guard_open_seconds",
            "Time a retry-flood guard was not closed, counted when it closes",
            ["handler"],
            registry=r,
        )
        self.guard_refused = Counter(
            "retrytopics_flood_guard_refused",
            "Calls a retry-flood guard refused (the record held, read again later)",
            ["handler"],
            registry=r,
        )
        self.guard_deferred = Counter(
            "retrytopics_flood_guard_deferred",
            "Records out of attempts while their handler's guard was open: not dead-lettered, read again later",
            ["handler", "reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            "retrytopics_concurrency_in_flight",
            "Handler calls in flight in one consumer's window, sampled once a second (docs/concurrency.md)",
            ["consumer", "handler"],
            registry=r,
        )
        self.window_full = Counter(
            "retrytopics_concurrency_window_full",
            "Times a handler's in-flight window on a consumer filled (a record read again later), once per episode",
            ["consumer", "handler"],
            registry=r,
        )
        self.first_attempts = Counter(
            "retrytopics_first_attempts",
            "Handler calls on a source topic (a record's first attempt): retry amplification is every handler call "
            "(handled + failed) over these",
            ["topic"],
            registry=r,
        )
        self.failures_by_exception = Counter(
            "retrytopics_handler_failures",
            "Handler calls that raised, by exception type (the class name, NonRetryable's and Retry's cause's)",
            ["topic", "exception"],
            registry=r,
        )
        self.partition_lag = Gauge(
            "retrytopics_partition_lag_records",
            "Records after the first unhandled one, per partition, measured by the consumer once a second (true "
            "while the partition is paused)",
            ["group", "topic", "partition", "role"],
            registry=r,
        )
        self.partition_lag_seconds = Gauge(
            "retrytopics_partition_lag_seconds",
            "How long ago the first unhandled record of the partition was appended (a tier's includes its delay)",
            ["group", "topic", "partition", "role"],
            registry=r,
        )
        self._paused: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._tier_topics: set[str] = set()
        #: partition -> (group, lag, role) last measured
        self._measured: dict[tuple[str, int], tuple[str, int, str]] = {}
        self._due: dict[tuple[str, int], int | None] = {}  # tier partition -> due time of the record it waits on
        self.registry.register(_OldestDue(self))

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose `/metrics` over HTTP on `port` (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)

    def track_health(self, probe: Callable[[], bool]) -> None:
        """Report `probe()` (e.g. `lambda: app.healthy`) as `retrytopics_healthy` at each scrape."""
        self.healthy.set_function(lambda: _probe(probe))

    def consumer_properties(self) -> dict[str, object]:
        """librdkafka properties that make a consumer report its lag to this hook."""
        return {"statistics.interval.ms": STATISTICS_INTERVAL_MS, "stats_cb": self.on_statistics}

    def on_statistics(self, stats_json: str) -> None:
        """librdkafka's stats_cb: set the lag of each topic this consumer has partitions of, unless the consumers
        measure it (`lag.measured`: librdkafka's freezes while a partition is paused)."""
        try:
            for topic, lag in consumer_lag(json.loads(stats_json)).items():
                with self._lock:
                    if any(t == topic for t, _ in self._measured):
                        continue
                self.lag.labels(topic).set(lag)
        except (ValueError, TypeError, AttributeError):  # a malformed report must not break the consumer
            log.debug("unreadable librdkafka statistics", exc_info=True)

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        topic = str(data.get("topic", ""))
        if event is Event.RECORDS_HANDLED:
            self.handled.labels(topic).inc(_count(data))
            self._first_attempts(topic, _count(data))
            self._observe_latenesses(topic, data)
        elif event is Event.RECORDS_FAILED:
            self.failed.labels(topic).inc(_count(data))
            self._first_attempts(topic, _count(data))
            self._observe_latenesses(topic, data)
        elif event is Event.RECORD_FAILED:  # counted in its sum (records.failed): here its exception type only
            self.failures_by_exception.labels(topic, str(data.get("error", ""))).inc()
        elif event is Event.LAG_MEASURED:
            self._measure(topic, data)
        elif event is Event.CONSUMER_STARTED:
            self._learn_tiers(data.get("tier_topics"))
        elif event in (Event.RETRIES_SCHEDULED, Event.RETRY_SCHEDULED):
            self.retried.labels(topic, str(data.get("destination", ""))).inc(_count(data))
        elif event is Event.DLQ_DISPATCHED:
            self.dead_lettered.labels(topic, str(data.get("reason", ""))).inc()
        elif event is Event.DUPLICATE_SUPPRESSED:
            self.duplicates.labels(topic).inc()
        elif event is Event.PUBLISH_FAILED:
            self.publish_failures.labels(str(data.get("destination", ""))).inc()
        elif event is Event.RECORD_ABANDONED:
            self.abandoned.labels(topic).inc()
        elif event is Event.RECORDS_ACKNOWLEDGED:
            self._observe_acknowledged(str(data.get("consumer", "")), data)
        elif event is Event.ACKNOWLEDGEMENT_FAILED:
            self.acknowledgement_failures.labels(str(data.get("consumer", ""))).inc()
        elif event is Event.OFFSETS_COMMITTED:
            self.commits.labels(str(data.get("consumer", ""))).inc()
        elif event in (Event.KEY_ORDER_BLOCKED, Event.KEY_ORDER_RELEASED):
            self.blocked_keys.labels(topic, str(data.get("partition", ""))).set(_int(data.get("blocked_keys")))
        elif event is Event.KEY_ORDER_FOLLOWED:
            self.followers.labels(topic).inc()
        elif event is Event.KEY_ORDER_BOUND_REACHED:
            self.bound_reached.labels(topic).inc()
        elif event is Event.KEY_ORDER_UNPROVEN:
            self.unproven.labels(topic).inc()
        elif event is Event.KEY_STATE_REFUSED:
            for reason in ("malformed", "forged"):
                self.key_state_refused.labels(topic, reason).inc(_int(data.get(reason)))
        elif event is Event.CONCURRENCY_SAMPLED:
            self.in_flight.labels(str(data.get("consumer", "")), str(data.get("handler", ""))).set(
                _int(data.get("in_flight"))
            )
        elif event is Event.CONCURRENCY_WINDOW_FULL:
            self.window_full.labels(str(data.get("consumer", "")), str(data.get("handler", ""))).inc()
        elif event in _GUARD_EVENTS:
            self._count_guard(event, str(data.get("handler", "")), data)
        elif event in (Event.PARTITION_PAUSED, Event.PARTITION_RESUMED):
            self._track_pause(event, topic, data.get("partition"))
        elif event in (Event.PARTITIONS_REVOKED, Event.PARTITIONS_LOST):
            self._forget(data.get("partitions"))

    def _count_guard(self, event: Event, handler: str, data: Mapping[str, object]) -> None:
        reason = str(data.get("reason", ""))
        if event is Event.FLOOD_GUARD_OPENED:
            self.guard_state.labels(handler).set(1)
            # an operator's free text is no label: every change by hand counts as `by_hand`
            self.guard_openings.labels(handler, reason if reason in _GUARD_REASONS else "by_hand").inc()
        elif event is Event.FLOOD_GUARD_CLOSED:
            self.guard_state.labels(handler).set(0)
            self.guard_open_seconds.labels(handler).inc(max(0, _int(data.get("open_ms"))) / 1000)
        elif event is Event.FLOOD_GUARD_PROBED:
            self.guard_probes.labels(handler, str(bool(data.get("succeeded"))).lower()).inc()
        elif event is Event.FLOOD_GUARD_REFUSED:
            self.guard_refused.labels(handler).inc()
        else:
            self.guard_deferred.labels(handler, reason).inc()

    def _learn_tiers(self, tiers: object) -> None:
        if isinstance(tiers, list):
            with self._lock:
                self._tier_topics.update(t for t in tiers if isinstance(t, str))

    def _first_attempts(self, topic: str, count: int) -> None:
        if topic not in self._tier_topics:
            self.first_attempts.labels(topic).inc(count)

    def _measure(self, topic: str, data: Mapping[str, object]) -> None:
        partition, group = _int(data.get("partition")), str(data.get("group", ""))
        lag, lag_s, due_at = _int(data.get("lag")), data.get("lag_s"), data.get("due_at")
        role = "tier" if topic in self._tier_topics else "source"
        self.partition_lag.labels(group, topic, str(partition), role).set(lag)
        self.partition_lag_seconds.labels(group, topic, str(partition), role).set(
            lag_s if isinstance(lag_s, float) else 0
        )
        with self._lock:
            self._measured[(topic, partition)] = (group, lag, role)
            self._due[(topic, partition)] = due_at if isinstance(due_at, int) else None
            total = sum(lag for (t, _), (_, lag, _) in self._measured.items() if t == topic)
        self.lag.labels(topic).set(total)

    def oldest_due_ages_s(self, now_ms: int) -> dict[str, float]:
        """Per tier topic: how long the oldest record that is due but unhandled has been due (0: none)."""
        with self._lock:
            ages = dict.fromkeys(self._tier_topics, 0.0)
            for (topic, _), due_at in self._due.items():
                if topic not in ages:
                    continue  # a source partition: it waits on no due time
                age = 0.0 if due_at is None else max(0, now_ms - due_at) / 1000
                ages[topic] = max(ages.get(topic, 0.0), age)
        return ages

    def _observe_acknowledged(self, consumer: str, data: Mapping[str, object]) -> None:
        for kind in ("accepted", "released", "rejected", "renewed"):
            count = data.get(kind)
            if isinstance(count, int):
                self.acknowledgements.labels(consumer, kind).inc(count)
        counts = data.get("delivery_counts")
        for delivery_count, records in counts.items() if isinstance(counts, Mapping) else ():
            if isinstance(delivery_count, int) and isinstance(records, int):
                for _ in range(records):
                    self.delivery_counts.labels(consumer).observe(delivery_count)

    def _observe_latenesses(self, topic: str, data: Mapping[str, object]) -> None:
        lateness = data.get("lateness_ms")
        for ms in lateness if isinstance(lateness, tuple) else ():
            self.lateness.labels(topic).observe(max(0, ms) / 1000)

    def _track_pause(self, event: Event, topic: str, partition: object) -> None:
        if not isinstance(partition, int):
            return
        with self._lock:
            if event is Event.PARTITION_PAUSED:
                self._paused.add((topic, partition))
            else:
                self._paused.discard((topic, partition))
            self._publish_paused()

    def _forget(self, partitions: object) -> None:
        if not isinstance(partitions, list | tuple | set | frozenset):
            return
        with self._lock:
            for item in partitions:
                coordinates = (getattr(item, "topic", None), getattr(item, "partition", None))
                if isinstance(item, tuple) and len(item) == 2:
                    coordinates = item
                self._paused.discard(coordinates)
                measured = self._measured.pop(coordinates, None)  # type: ignore[arg-type]
                self._due.pop(coordinates, None)  # type: ignore[arg-type]
                if measured is not None:  # its new owner reports it
                    labels = (measured[0], str(coordinates[0]), str(coordinates[1]), measured[2])
                    self.partition_lag.remove(*labels)
                    self.partition_lag_seconds.remove(*labels)
                if (
                    coordinates[0] is not None
                    and (str(coordinates[0]), str(coordinates[1])) in self.blocked_keys._metrics
                ):
                    self.blocked_keys.remove(str(coordinates[0]), str(coordinates[1]))  # its new owner reports it
            self._publish_paused()

    def _publish_paused(self) -> None:
        per_topic: dict[str, int] = {}
        for topic, _ in self._paused:
            per_topic[topic] = per_topic.get(topic, 0) + 1
        for labels in list(self.paused._metrics):
            if labels[0] not in per_topic:
                self.paused.labels(*labels).set(0)
        for topic, count in per_topic.items():
            self.paused.labels(topic).set(count)


class _OldestDue:
    """`retrytopics_tier_oldest_due_age_seconds`, computed at each scrape from the due times last measured: it
    keeps growing while a stuck consumer measures nothing more."""

    def __init__(self, hook: PrometheusHook) -> None:
        self._hook = hook

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "retrytopics_tier_oldest_due_age_seconds",
            "How long the oldest tier record that is due but not handled has been due (0: none), per tier topic",
            labels=["topic"],
        )
        for topic, age in sorted(self._hook.oldest_due_ages_s(int(time.time() * 1000)).items()):
            family.add_metric([topic], age)
        yield family


def _count(data: Mapping[str, object]) -> int:
    """A summed event's `count`; a per-record event counts one."""
    count = data.get("count", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) else 1


#: the reasons a guard opens by itself (core/flood_guard.py); any other is an operator's text
_GUARD_REASONS = frozenset({"failure_ratio", "dead_letters", "probe_failed"})


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _probe(probe: Callable[[], bool]) -> float:
    try:
        return 1.0 if probe() else 0.0
    except Exception:  # noqa: BLE001 - a scrape must answer; a probe that fails reports unhealthy
        return 0.0


def consumer_lag(stats: Mapping[str, object]) -> dict[str, int]:
    """Lag per topic from one librdkafka statistics report: the sum of `consumer_lag` over its partitions
    (librdkafka reports -1 for a partition it does not consume or whose committed offset it does not know,
    and the internal partition -1)."""
    lag: dict[str, int] = {}
    topics = stats.get("topics")
    for topic, entry in (topics or {}).items() if isinstance(topics, dict) else ():
        partitions = entry.get("partitions", {}) if isinstance(entry, dict) else {}
        known = [p.get("consumer_lag", -1) for key, p in partitions.items() if key != "-1" and isinstance(p, dict)]
        known = [value for value in known if isinstance(value, int) and value >= 0]
        if known:
            lag[topic] = sum(known)
    return lag
