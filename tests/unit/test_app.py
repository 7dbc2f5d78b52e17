"""The handler decorator registers without wrapping, refuses ambiguous registrations, and the testing helpers
let a handler be unit-tested (sync or async) and its failures routed, without Kafka."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import retrytopics
from retrytopics import ConfigError, InProcessRetry, KafkaConfig, NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.core.headers import DlqReason
from retrytopics.core.router import RouteKind
from retrytopics.runtime.consumer.settings import select_tiers
from retrytopics.testing import call, make_record, route_for

POLICY = RetryPolicy(delays=["5s", "30s"])


def _app() -> RetryApp:
    return RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")


def test_decorated_function_stays_a_plain_callable() -> None:
    app = _app()

    def charge(record: Record[bytes]) -> str:
        return f"charged {record.value!r}"

    decorated = app.handler("orders", policy=POLICY)(charge)
    assert decorated is charge
    assert charge(make_record(b"x")) == "charged b'x'"
    assert app.handlers["orders"].handler is charge
    assert [t.topic for t in app.topics("orders").tiers] == ["orders.billing.retry.5s", "orders.billing.retry.30s"]


def test_one_handler_per_topic() -> None:
    app = _app()
    app.handler("orders")(lambda record: None)
    with pytest.raises(ConfigError, match="already handled"):
        app.handler("orders")(lambda record: None)


def test_bad_topic_group_and_policy_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="group"):
        RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="bad group")
    with pytest.raises(ConfigError, match="topic"):
        _app().handler("no/slashes")
    with pytest.raises(ConfigError, match="policy"):
        _app().handler("orders", policy={"delays": ["5s"]})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch_size"):
        RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="g", batch_size=0)


def test_in_process_retries_must_fit_in_max_poll_interval_at_registration() -> None:
    # setup: a consumer allowed 10 s between polls
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9"),
        group="billing",
        consumer_overrides={"max.poll.interval.ms": 10_000, "session.timeout.ms": 6000},
    )
    fits = RetryPolicy(delays=["5s"], in_process=InProcessRetry(attempts=3, wait="1s"))
    too_long = RetryPolicy(delays=["5s"], in_process=InProcessRetry(attempts=5, wait="1s"))
    # when/then: 3 x (1 s + 2 s) = 9 s fits; 5 x (1 s + 1 s) = 10 s could be evicted
    app.handler("orders", policy=fits, handler_budget="2s")(lambda record: None)
    with pytest.raises(ConfigError) as refused:
        app.handler("payments", policy=too_long)(lambda record: None)
    assert refused.value.field == "in_process" and "max.poll.interval.ms=10000" in str(refused.value)
    assert "payments" not in app.handlers
    with pytest.raises(ConfigError) as bad_budget:
        app.handler("refunds", policy=fits, handler_budget=5)(lambda record: None)
    assert bad_budget.value.field == "handler_budget"
    assert app.max_poll_interval_ms == 10_000 and _app().max_poll_interval_ms == 300_000


def test_an_exactly_once_poll_interval_never_falls_below_the_session_timeout() -> None:
    """librdkafka refuses a consumer whose max.poll.interval.ms is below its session.timeout.ms (45 s by
    default): the exactly-once default (20 s) yields to a longer session, and an explicit value is kept."""
    kafka = KafkaConfig(bootstrap="127.0.0.1:9")
    assert RetryApp(kafka=kafka, group="g", exactly_once=True).max_poll_interval_ms == 45_000
    short = RetryApp(kafka=kafka, group="g", exactly_once=True, consumer_overrides={"session.timeout.ms": 6000})
    assert short.max_poll_interval_ms == 20_000
    given = RetryApp(
        kafka=kafka,
        group="g",
        exactly_once=True,
        consumer_overrides={"session.timeout.ms": 6000, "max.poll.interval.ms": 12_000},
    )
    assert given.max_poll_interval_ms == 12_000


def test_start_without_handlers_is_refused() -> None:
    with pytest.raises(ConfigError, match="no handler"):
        _app().start()


def test_tier_selection_by_delay_name_or_all() -> None:
    app = _app()
    app.handler("orders", policy=POLICY)(lambda r: None)
    app.handler("refunds", policy=RetryPolicy(delays=["30s"]))(lambda r: None)
    assert select_tiers(app.handlers, "all") == [
        "orders.billing.retry.5s",
        "orders.billing.retry.30s",
        "refunds.billing.retry.30s",
    ]
    assert select_tiers(app.handlers, ["30s"]) == ["orders.billing.retry.30s", "refunds.billing.retry.30s"]
    assert select_tiers(app.handlers, ["orders.billing.retry.5s"]) == ["orders.billing.retry.5s"]
    with pytest.raises(ConfigError, match="tiers"):
        select_tiers(app.handlers, ["1m"])


def test_async_handlers_can_be_called_directly() -> None:
    async def charge(record: Record[int]) -> int:
        return record.value * 2

    assert call(charge, make_record(21)) == 42


def test_route_for_shows_where_a_failure_goes() -> None:
    app = _app()
    app.handler("orders", policy=POLICY)(lambda r: None)
    first = make_record(b"v", topic="orders", key=b"k")
    decision = route_for(app, first, TimeoutError("slow"), now_ms=1_000)
    assert (decision.kind, decision.topic, decision.due_at_ms) == (RouteKind.TIER, "orders.billing.retry.5s", 6_000)
    last = make_record(b"v", topic="orders", attempt=3, now_ms=1_000)
    assert route_for(app, last, TimeoutError("slow"), now_ms=2_000).reason is DlqReason.EXHAUSTED
    assert route_for(app, first, NonRetryable("bad")).reason is DlqReason.NON_RETRYABLE


def test_record_helpers() -> None:
    record = make_record(b"v", headers=[("h", b"1"), ("h", b"2")], attempt=3)
    assert (record.attempt, record.reconsume_times, record.is_retry) == (3, 2, True)
    assert record.header("h") == b"2" and record.header("missing") is None


def test_facade_exports_exactly_what_it_imports() -> None:
    source = inspect.getsource(retrytopics)
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    } - {"annotations"}
    assert sorted(retrytopics.__all__) == sorted(imported)
    assert len(set(retrytopics.__all__)) == len(retrytopics.__all__)


def test_only_connectors_import_the_kafka_client() -> None:
    root = Path(retrytopics.__file__).parent
    optional = {root / "observe" / "metrics.py"}  # the `metrics` extra: a hook, imported only by users who install it
    for path in set(root.rglob("*.py")) - optional:
        tree = ast.parse(path.read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m.split(".")[0] in {"confluent_kafka", "fastavro", "prometheus_client"} for m in modules), path
