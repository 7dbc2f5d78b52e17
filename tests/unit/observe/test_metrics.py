"""The Prometheus hook turns runtime events into counters, a lateness histogram and a paused gauge."""

from __future__ import annotations

import time
import urllib.request

from retrytopics.connectors.embedded import free_port
from retrytopics.observe.events import Emitter, Event
from retrytopics.observe.metrics import PrometheusHook


def _value(hook: PrometheusHook, name: str, **labels: str) -> float | None:
    return hook.registry.get_sample_value(name, labels)


def test_events_become_metrics() -> None:
    hook = PrometheusHook()
    emit = Emitter([hook]).emit
    # per-record successes are not wanted by the hook (it counts the per-batch sums): delivered to nobody
    emit(Event.RECORD_HANDLED, topic="orders", partition=0, offset=9, attempt=1)
    emit(Event.RECORDS_HANDLED, topic="orders", partition=0, count=3, first_offset=1, last_offset=4, lateness_ms=())
    emit(
        Event.RECORDS_HANDLED,
        topic="orders.b.retry.1s",
        partition=0,
        count=1,
        first_offset=1,
        last_offset=1,
        lateness_ms=(40,),
    )
    emit(Event.RECORD_FAILED, topic="orders", partition=0, offset=2, attempt=1, error="boom")
    emit(Event.RECORDS_FAILED, topic="orders", partition=0, count=1, lateness_ms=())
    emit(Event.RETRY_SCHEDULED, topic="orders", partition=0, offset=2, destination="orders.b.retry.1s", due_at=5)
    emit(Event.DLQ_DISPATCHED, topic="orders", partition=0, offset=3, destination="orders.b.dlq", reason="poison")
    emit(Event.PARTITION_PAUSED, topic="orders.b.retry.1s", partition=0, until=10)
    emit(Event.PARTITION_PAUSED, topic="orders.b.retry.1s", partition=1, until=10)
    emit(Event.PARTITION_RESUMED, topic="orders.b.retry.1s", partition=0)

    assert _value(hook, "retrytopics_records_handled_total", topic="orders") == 3
    assert _value(hook, "retrytopics_records_failed_total", topic="orders") == 1
    assert _value(hook, "retrytopics_records_retried_total", topic="orders", tier_topic="orders.b.retry.1s") == 1
    assert _value(hook, "retrytopics_records_dead_lettered_total", topic="orders", reason="poison") == 1
    assert _value(hook, "retrytopics_lateness_seconds_count", topic="orders.b.retry.1s") == 1
    assert _value(hook, "retrytopics_lateness_seconds_bucket", topic="orders.b.retry.1s", le="0.05") == 1
    assert _value(hook, "retrytopics_lateness_seconds_bucket", topic="orders.b.retry.1s", le="0.025") == 0
    assert _value(hook, "retrytopics_paused_partitions", topic="orders.b.retry.1s") == 1


def test_key_order_events_become_metrics() -> None:
    """Blocked keys per source partition (a gauge, forgotten when the partition is revoked), followers, pauses
    at the bound and unproven followers (counters)."""
    hook = PrometheusHook()
    emit = Emitter([hook]).emit
    emit(Event.KEY_ORDER_BLOCKED, topic="orders", partition=1, blocked_keys=2)
    emit(Event.KEY_ORDER_FOLLOWED, topic="orders", partition=1, offset=7, destination="orders.b.retry.1s")
    emit(Event.KEY_ORDER_BOUND_REACHED, topic="orders", partition=1)
    emit(Event.KEY_ORDER_UNPROVEN, topic="orders.b.retry.1s", partition=0, offset=3)
    assert _value(hook, "retrytopics_key_order_blocked_keys", topic="orders", partition="1") == 2
    assert _value(hook, "retrytopics_key_order_followers_total", topic="orders") == 1
    assert _value(hook, "retrytopics_key_order_bound_reached_total", topic="orders") == 1
    assert _value(hook, "retrytopics_key_order_unproven_total", topic="orders.b.retry.1s") == 1
    emit(Event.KEY_ORDER_RELEASED, topic="orders", partition=1, blocked_keys=1)
    assert _value(hook, "retrytopics_key_order_blocked_keys", topic="orders", partition="1") == 1
    emit(Event.PARTITIONS_REVOKED, partitions=[("orders", 1)])
    assert _value(hook, "retrytopics_key_order_blocked_keys", topic="orders", partition="1") is None


def test_flood_guard_events_become_metrics() -> None:
    """A guard's state (1 open or probing, 0 closed), openings by reason, probes by outcome, refused calls and
    records spared the DLQ (docs/flood-guard.md)."""
    hook = PrometheusHook()
    emit = Emitter([hook]).emit
    emit(Event.FLOOD_GUARD_OPENED, handler="orders", reason="failure_ratio", backoff_ms=1000)
    emit(Event.FLOOD_GUARD_REFUSED, handler="orders", consumer="c", topic="orders", partition=0)
    emit(
        Event.FLOOD_GUARD_DEFERRED, handler="orders", consumer="c", topic="t", partition=0, offset=3, reason="exhausted"
    )
    emit(Event.FLOOD_GUARD_PROBED, handler="orders", consumer="c", succeeded=False)
    assert _value(hook, "retrytopics_flood_guard_state", handler="orders") == 1
    assert _value(hook, "retrytopics_flood_guard_openings_total", handler="orders", reason="failure_ratio") == 1
    assert _value(hook, "retrytopics_flood_guard_refused_total", handler="orders") == 1
    assert _value(hook, "retrytopics_flood_guard_deferred_total", handler="orders", reason="exhausted") == 1
    assert _value(hook, "retrytopics_flood_guard_probes_total", handler="orders", succeeded="false") == 1
    emit(Event.FLOOD_GUARD_PROBED, handler="orders", consumer="c", succeeded=True)
    emit(Event.FLOOD_GUARD_CLOSED, handler="orders", reason="probe_succeeded", open_ms=3000)
    assert _value(hook, "retrytopics_flood_guard_state", handler="orders") == 0
    assert _value(hook, "retrytopics_flood_guard_probes_total", handler="orders", succeeded="true") == 1
    assert _value(hook, "retrytopics_flood_guard_open_seconds_total", handler="orders") == 3.0
    # an operator's reason is not a label (its text is free): opened by hand counts as `by_hand`
    emit(Event.FLOOD_GUARD_OPENED, handler="orders", reason="by hand (ops@host): gateway maintenance", backoff_ms=0)
    assert _value(hook, "retrytopics_flood_guard_openings_total", handler="orders", reason="by_hand") == 1


def test_concurrency_events_become_metrics() -> None:
    """A windowed handler's calls in flight (a gauge, sampled) and its window filling (docs/concurrency.md)."""
    hook = PrometheusHook()
    emit = Emitter([hook]).emit
    emit(Event.CONCURRENCY_SAMPLED, consumer="billing:main", handler="orders", in_flight=180, waiting=20)
    emit(Event.CONCURRENCY_WINDOW_FULL, consumer="billing:main", handler="orders", in_flight=200)
    emit(Event.CONCURRENCY_WINDOW_FULL, consumer="billing:main", handler="orders", in_flight=200)
    labels = {"consumer": "billing:main", "handler": "orders"}
    assert _value(hook, "retrytopics_concurrency_in_flight", **labels) == 180
    assert _value(hook, "retrytopics_concurrency_window_full_total", **labels) == 2


def test_metrics_endpoint_serves_the_counters() -> None:
    hook = PrometheusHook()
    port = free_port()
    hook.serve(port, addr="127.0.0.1")
    hook.on_event(Event.DLQ_DISPATCHED, {"topic": "orders", "reason": "exhausted"})
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'retrytopics_records_dead_lettered_total{reason="exhausted",topic="orders"} 1.0' in body


def test_health_is_read_at_each_scrape_and_a_failing_probe_reads_unhealthy() -> None:
    hook = PrometheusHook()
    state = {"healthy": True}
    hook.track_health(lambda: state["healthy"])
    assert _value(hook, "retrytopics_healthy") == 1
    state["healthy"] = False
    assert _value(hook, "retrytopics_healthy") == 0
    hook.track_health(lambda: 1 / 0 > 0)
    assert _value(hook, "retrytopics_healthy") == 0


def test_consumer_lag_per_topic_from_librdkafka_statistics() -> None:
    import json

    hook = PrometheusHook()
    stats = {
        "type": "consumer",
        "topics": {
            "orders.b.retry.5s": {
                "partitions": {"0": {"consumer_lag": 7}, "1": {"consumer_lag": 3}, "-1": {"consumer_lag": -1}}
            },
            "orders": {"partitions": {"0": {"consumer_lag": -1}}},  # not consumed here: no series
        },
    }
    hook.on_statistics(json.dumps(stats))
    assert _value(hook, "retrytopics_consumer_lag", topic="orders.b.retry.5s") == 10
    assert _value(hook, "retrytopics_consumer_lag", topic="orders") is None
    hook.on_statistics("{not json")  # ignored, never raised into librdkafka's callback
    properties = hook.consumer_properties()
    assert properties["stats_cb"] == hook.on_statistics and int(properties["statistics.interval.ms"]) > 0


def test_share_acknowledgements_become_metrics_and_stats() -> None:
    """A share consumer's `records.acknowledged` counts each acknowledgement type (renewed present at 0:
    confluent-kafka 2.16 has no RENEW) and observes each record's delivery count; a refused acknowledgement
    commit is counted; `Stats.acknowledged` sums the types."""
    from retrytopics.observe.events import StatsCollector

    hook, stats = PrometheusHook(), StatsCollector()
    emit = Emitter([hook, stats]).emit
    acknowledged = {"accepted": 4, "released": 1, "rejected": 0, "renewed": 0, "delivery_counts": {1: 3, 2: 2}}
    emit(Event.RECORDS_ACKNOWLEDGED, consumer="billing:main", **acknowledged)
    emit(Event.ACKNOWLEDGEMENT_FAILED, consumer="billing:main", partitions=[("orders", 0)], error="lock expired")

    def acks(kind: str) -> float | None:
        return _value(hook, "retrytopics_share_acknowledgements_total", consumer="billing:main", type=kind)

    assert (acks("accepted"), acks("released"), acks("rejected"), acks("renewed")) == (4, 1, 0, 0)
    assert _value(hook, "retrytopics_share_delivery_count_count", consumer="billing:main") == 5
    assert _value(hook, "retrytopics_share_delivery_count_sum", consumer="billing:main") == 7
    assert _value(hook, "retrytopics_share_acknowledgement_failures_total", consumer="billing:main") == 1
    assert dict(stats.snapshot().acknowledged) == {"accepted": 4, "released": 1}


def test_failure_sums_become_the_same_metrics() -> None:
    """`records.failed` and `retries.scheduled` (what the hook counts instead of each `record.failed` and
    `retry.scheduled`) add their counts, and each retried record's lateness is observed once."""
    hook = PrometheusHook()
    emit = Emitter([hook]).emit
    emit(Event.RECORDS_FAILED, topic="orders", partition=0, count=4, lateness_ms=())
    emit(Event.RECORDS_FAILED, topic="orders.b.retry.1s", partition=0, count=2, lateness_ms=(10, 30))
    emit(Event.RETRIES_SCHEDULED, topic="orders", partition=0, destination="orders.b.retry.1s", count=4)
    emit(Event.RETRIES_SCHEDULED, topic="orders", partition=1, destination="orders.b.retry.1s", count=1)

    assert _value(hook, "retrytopics_records_failed_total", topic="orders") == 4
    assert _value(hook, "retrytopics_records_failed_total", topic="orders.b.retry.1s") == 2
    assert _value(hook, "retrytopics_records_retried_total", topic="orders", tier_topic="orders.b.retry.1s") == 5
    assert _value(hook, "retrytopics_lateness_seconds_count", topic="orders.b.retry.1s") == 2
    assert _value(hook, "retrytopics_lateness_seconds_bucket", topic="orders.b.retry.1s", le="0.025") == 1


def test_measured_lag_oldest_due_and_first_attempts() -> None:
    # setup: a tier consumer started; its partition 0 waits on a record due 5 s ago, partition 1 on none
    hook = PrometheusHook()
    emit = Emitter([hook]).emit
    tier = "orders.b.retry.1s"
    emit(Event.CONSUMER_STARTED, consumer=tier, group=tier, topics=[tier], tier_topics=[tier])
    due = int(time.time() * 1000) - 5_000
    emit(Event.LAG_MEASURED, consumer=tier, group=tier, topic=tier, partition=0, lag=4, lag_s=7.5, due_at=due)
    emit(Event.LAG_MEASURED, consumer=tier, group=tier, topic=tier, partition=1, lag=2, lag_s=0.5, due_at=None)
    # then: per-partition lag, the topic's sum, and an oldest due age of at least 5 s
    assert _value(hook, "retrytopics_partition_lag_records", group=tier, topic=tier, partition="0", role="tier") == 4
    assert _value(hook, "retrytopics_partition_lag_seconds", group=tier, topic=tier, partition="0", role="tier") == 7.5
    assert _value(hook, "retrytopics_consumer_lag", topic=tier) == 6
    age = _value(hook, "retrytopics_tier_oldest_due_age_seconds", topic=tier)
    assert age is not None and 5 <= age < 60
    # and a source partition measured beside it has lag but no oldest due age
    emit(Event.LAG_MEASURED, consumer="m", group="b", topic="orders", partition=0, lag=1, lag_s=0.1, due_at=None)
    assert (
        _value(hook, "retrytopics_partition_lag_records", group="b", topic="orders", partition="0", role="source") == 1
    )
    assert _value(hook, "retrytopics_tier_oldest_due_age_seconds", topic="orders") is None
    # when: calls on the source and on the tier
    emit(Event.RECORDS_HANDLED, topic="orders", partition=0, count=3, first_offset=1, last_offset=3, lateness_ms=())
    emit(Event.RECORDS_FAILED, topic=tier, partition=0, count=2, lateness_ms=(1, 2))
    # then: only the source's are first attempts (amplification: 5 calls over 3 first attempts)
    assert _value(hook, "retrytopics_first_attempts_total", topic="orders") == 3
    assert _value(hook, "retrytopics_first_attempts_total", topic=tier) is None
    # when: the partition is revoked, its series go (its new owner reports it) and the oldest due age is 0
    emit(Event.PARTITIONS_REVOKED, consumer=tier, partitions=[(tier, 0)])
    assert _value(hook, "retrytopics_partition_lag_records", group=tier, topic=tier, partition="0", role="tier") is None
    assert _value(hook, "retrytopics_tier_oldest_due_age_seconds", topic=tier) == 0


def test_failures_by_exception_type_when_asked() -> None:
    lean, by_type = PrometheusHook(), PrometheusHook(failures_by_exception=True)
    emitter = Emitter([lean, by_type])
    assert emitter.wants_each(Event.RECORD_FAILED)  # only because `by_type` asked
    for error in ("TimeoutError", "TimeoutError", "KeyError"):
        emitter.emit_each(Event.RECORD_FAILED, topic="orders", partition=0, offset=1, attempt=1, error=error)
    emitter.emit(Event.RECORDS_FAILED, topic="orders", partition=0, count=3, lateness_ms=())
    for hook in (lean, by_type):
        assert _value(hook, "retrytopics_records_failed_total", topic="orders") == 3
    assert _value(by_type, "retrytopics_handler_failures_total", topic="orders", exception="TimeoutError") == 2
    assert _value(lean, "retrytopics_handler_failures_total", topic="orders", exception="TimeoutError") is None
    assert not Emitter([lean]).wants_each(Event.RECORD_FAILED)
