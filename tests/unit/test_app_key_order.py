"""Registering a key-ordered handler (docs/key-ordering.md): checked at registration, refused with a share consumer (no partition order to keep)."""

from __future__ import annotations

from typing import Any

import pytest

from retrytopics import ConfigError, DeadHeadPolicy, KafkaConfig, KeyOrdering, Record, RetryApp, RetryPolicy
from retrytopics.connectors.admin import ProvisionOutcome, TopicSpec
from retrytopics.operator.config import load_settings
from retrytopics.operator.preflight import app_pipeline
from retrytopics.testing import MemoryBroker, MemoryClientFactory

POLICY = RetryPolicy(delays=["5s", "30s"])


def _app() -> RetryApp:
    return RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing")


def test_a_handler_declared_with_key_ordering_keeps_it_on_its_binding() -> None:
    """The ordering given at registration is the one the binding carries; a handler without it has none."""
    app = _app()
    ordering = KeyOrdering(dead_head="dead_letter", max_blocked_keys=10)

    @app.handler("orders", policy=POLICY, ordering=ordering)
    def charge(record: Record[bytes]) -> None:
        pass

    app.handler("refunds", policy=POLICY)(lambda record: None)

    assert app.handlers["orders"].ordering is ordering
    assert app.handlers["orders"].ordering.dead_head is DeadHeadPolicy.DEAD_LETTER
    assert app.handlers["refunds"].ordering is None


@pytest.mark.parametrize("ordering", ["key", {"dead_head": "release"}, True])
def test_an_ordering_that_is_not_a_key_ordering_is_refused_naming_the_field(ordering: object) -> None:
    """A wrong type (the issue's `ordering="key"` included) fails at registration with the field named, and
    binds nothing."""
    app = _app()
    with pytest.raises(ConfigError) as info:
        app.handler("orders", policy=POLICY, ordering=ordering)  # type: ignore[arg-type]
    assert info.value.field == "ordering"
    assert "orders" not in app.handlers


def test_a_bad_key_ordering_fails_where_it_is_built_naming_the_field() -> None:
    """Each bound and the dead-head policy are checked when the KeyOrdering is made, before any handler."""
    for kwargs, field in [
        ({"dead_head": "drop"}, "dead_head"),
        ({"max_blocked_keys": 0}, "max_blocked_keys"),
        ({"max_blocked_keys": 10, "max_tracked_records": 5}, "max_tracked_records"),
    ]:
        with pytest.raises(ConfigError) as info:
            KeyOrdering(**kwargs)  # type: ignore[arg-type]
        assert info.value.field == field


def test_a_batch_handler_declared_with_key_ordering_keeps_it_on_its_binding() -> None:
    """A batch handler takes key ordering as a single-record handler does (its calls are cut per key at run
    time, docs/key-ordering.md section 8); a wrong type is refused naming the field, binding nothing."""
    app = _app()
    ordering = KeyOrdering(dead_head="dead_letter")

    @app.batch_handler("orders", policy=POLICY, ordering=ordering)
    def charge(records: list[Record[Any]]) -> None:
        pass

    assert app.handlers["orders"].batch and app.handlers["orders"].ordering is ordering
    with pytest.raises(ConfigError) as info:
        app.batch_handler("refunds", policy=POLICY, ordering="key")  # type: ignore[arg-type]
    assert info.value.field == "ordering" and "refunds" not in app.handlers


def test_start_refuses_key_ordering_where_it_is_not_enforced() -> None:
    """Key order is enforced on partition-based consumers, in both delivery modes (docs/key-ordering.md,
    section 12); a share group would hand a key's records out of order in silence: start-up fails instead,
    naming the field and the ordered topics, and starts nothing."""
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", consumer="share")
    app.handler("orders", policy=POLICY, ordering=KeyOrdering())(lambda record: None)
    app.handler("refunds", policy=POLICY)(lambda record: None)

    with pytest.raises(ConfigError) as info:
        app.start()
    assert info.value.field == "ordering"
    assert "orders" in str(info.value) and "refunds" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        app.start(main=False, tiers="all")
    assert info.value.field == "ordering"
    assert app.wait(timeout=0) and app.error is None


def test_a_dlq_named_like_the_key_state_topic_is_refused_for_an_ordered_handler() -> None:
    """The key-state topic and the DLQ are two topics: a DLQ given the key-state topic's name fails at
    registration with the field named; the same name is fine for a handler without ordering."""
    with pytest.raises(ConfigError) as info:
        _app().handler("orders", policy=POLICY, dlq="orders.billing.keys", ordering=KeyOrdering())
    assert info.value.field == "dlq"
    app = _app()
    app.handler("orders", policy=POLICY, dlq="orders.billing.keys")(lambda record: None)
    assert app.topics("orders").dlq == "orders.billing.keys"


def test_provision_creates_the_key_state_topic_of_an_ordered_handler_only() -> None:
    """`provision()` makes `<topic>.<group>.keys` for a key-ordered handler, with the source's partition count
    (the state of source partition p lives in partition p), and no such topic for a handler without ordering."""
    broker = MemoryBroker()
    broker.create_topics(["orders", "refunds"], partitions=3)
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", clients=MemoryClientFactory(broker))
    app.handler("orders", policy=POLICY, ordering=KeyOrdering())(lambda record: None)
    app.handler("refunds", policy=POLICY)(lambda record: None)

    outcome = app.provision()

    assert outcome["orders.billing.keys"] is ProvisionOutcome.CREATED
    assert broker.partition_count("orders.billing.keys") == 3
    assert not any(name.startswith("refunds") and name.endswith(".keys") for name in outcome)
    assert app.provision()["orders.billing.keys"] is ProvisionOutcome.EXISTS


def test_the_cli_pipeline_of_an_ordered_app_asks_for_its_key_state_topic() -> None:
    """`topics create --app` provisions what the app's handler needs: `key_ordering` follows `ordering=`, and
    `[app] key_ordering = true` sets it for a pipeline named in TOML."""
    app = _app()
    app.handler("orders", policy=POLICY, ordering=KeyOrdering())(lambda record: None)
    app.handler("refunds", policy=POLICY)(lambda record: None)
    assert app_pipeline(app, "orders").key_ordering
    assert not app_pipeline(app, "refunds").key_ordering
    assert load_settings(environ={"RETRYTOPICS_APP_KEY_ORDERING": "true"}).app.key_ordering
    assert not load_settings(environ={}).app.key_ordering


def _memory_app(broker: MemoryBroker) -> tuple[RetryApp, MemoryClientFactory]:
    clients = MemoryClientFactory(broker)
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9"), group="billing", clients=clients)
    app.handler("orders", policy=POLICY, ordering=KeyOrdering())(lambda record: None)
    return app, clients


def test_preflight_fails_naming_a_missing_key_state_topic_and_the_fix_until_it_is_provisioned() -> None:
    """An ordered app whose key-state topic does not exist fails the preflight with the field, the topic and
    both fixes named; once `provision()` made it (compacted, the source's partitions) the preflight passes."""
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=3)
    app, _ = _memory_app(broker)

    with pytest.raises(ConfigError) as info:
        app.preflight()
    assert (info.value.field, info.value.value) == ("key_state_topic", "orders.billing.keys")
    assert "does not exist" in str(info.value)
    assert "retrytopics topics create" in str(info.value) and "app.provision()" in str(info.value)
    app.provision()
    app.preflight()


@pytest.mark.parametrize(
    ("config", "partitions", "words"),
    [
        ({"cleanup.policy": "delete"}, 3, "cleanup.policy=delete, not compact"),
        ({"cleanup.policy": "compact,delete"}, 3, "cleanup.policy=compact,delete, not compact"),
        ({"cleanup.policy": "compact"}, 2, "has 2 partitions, the source 'orders' 3"),
    ],
)
def test_preflight_fails_for_a_key_state_topic_not_compacted_or_short_of_partitions(
    config: dict[str, str], partitions: int, words: str
) -> None:
    """A key-state topic that deletes by time (its live state could vanish) or lacks a source partition's
    partition fails the preflight naming the topic and what to change."""
    broker = MemoryBroker()
    broker.create_topic("orders", partitions=3)
    app, clients = _memory_app(broker)
    clients.ensure_topics([TopicSpec(name="orders.billing.keys", partitions=partitions, config=config)], 1.0)

    with pytest.raises(ConfigError) as info:
        app.preflight()
    assert (info.value.field, info.value.value) == ("key_state_topic", "orders.billing.keys")
    assert words in str(info.value)


def test_preflight_of_an_app_without_ordered_handlers_asks_no_broker() -> None:
    """Only key-ordered handlers need a key-state topic: an app without one passes with no broker at all."""
    app = _app()
    app.handler("orders", policy=POLICY)(lambda record: None)
    app.preflight(timeout="1ms")
