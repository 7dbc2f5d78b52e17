"""Exactly-once settings (retrytopics/core/transactions.py): `transaction.timeout.ms` always covers a poll batch and
its commit calls (by default exactly that, and a shorter value is refused at start-up naming the field), the
transactional ids are stable where the deployment names the process, and two apps of one process never run
the same transactional id."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics import ConfigError, KafkaConfig, RetryApp
from retrytopics.core.ports import ProducerPort
from retrytopics.core.transactions import (
    CALL_TIMEOUT_MS,
    EXACTLY_ONCE_MAX_POLL_INTERVAL_MS,
    default_instance_id,
    transaction_timeout_ms,
)
from retrytopics.testing import MemoryBroker, MemoryClientFactory

KAFKA = KafkaConfig(bootstrap="127.0.0.1:9")


@given(st.integers(min_value=1, max_value=880_000))
def test_the_default_transaction_timeout_covers_a_poll_batch_and_its_two_commit_calls(poll_ms: int) -> None:
    assert transaction_timeout_ms(poll_ms, {}) == poll_ms + 2 * CALL_TIMEOUT_MS


@given(st.integers(min_value=1, max_value=880_000), st.integers(min_value=0, max_value=1_000_000))
def test_a_given_transaction_timeout_is_kept_when_it_covers_them_and_refused_otherwise(
    poll_ms: int, given_ms: int
) -> None:
    needed = poll_ms + 2 * CALL_TIMEOUT_MS
    if given_ms >= needed:
        assert transaction_timeout_ms(poll_ms, {"transaction.timeout.ms": given_ms}) == given_ms
    else:
        with pytest.raises(ConfigError) as refused:
            transaction_timeout_ms(poll_ms, {"transaction.timeout.ms": given_ms})
        assert refused.value.field == "transaction.timeout.ms" and str(needed) in refused.value.reason


def test_a_poll_interval_no_broker_transaction_could_cover_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError) as refused:
        transaction_timeout_ms(895_000, {})
    assert refused.value.field == "max.poll.interval.ms"
    with pytest.raises(ConfigError, match="number of ms"):
        transaction_timeout_ms(20_000, {"transaction.timeout.ms": "soon"})


def test_the_instance_id_comes_from_the_setting_then_the_host_name_then_chance() -> None:
    def chance() -> str:
        return "random"

    assert default_instance_id({"RETRYTOPICS_INSTANCE_ID": "worker-2", "HOSTNAME": "pod-7"}, chance) == "worker-2"
    assert (
        default_instance_id({"RETRYTOPICS_INSTANCE_ID": " ", "HOSTNAME": "billing-5d9f-x2x"}, chance)
        == "billing-5d9f-x2x"
    )
    assert default_instance_id({}, chance) == "random"


class _Recording(MemoryClientFactory):
    """The memory broker's clients, remembering the settings each was asked for."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker)
        self.producers: list[tuple[str | None, dict[str, Any]]] = []
        self.consumers: list[dict[str, Any]] = []

    def producer(self, transactional_id: str | None, overrides: Mapping[str, Any]) -> ProducerPort:
        self.producers.append((transactional_id, dict(overrides)))
        return super().producer(transactional_id, overrides)

    def consumer(self, group_id: str, overrides: Mapping[str, Any]) -> Any:
        self.consumers.append(dict(overrides))
        return super().consumer(group_id, overrides)


def _eos_app(clients: MemoryClientFactory, **options: Any) -> RetryApp:
    app = RetryApp(kafka=KAFKA, group="billing", exactly_once=True, clients=clients, **options)
    app.handler("orders")(lambda record: None)
    return app


def test_an_exactly_once_app_starts_its_clients_with_the_bounding_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RETRYTOPICS_INSTANCE_ID", raising=False)
    monkeypatch.setenv("HOSTNAME", "billing-0")
    broker = MemoryBroker()
    broker.create_topic("orders")
    clients = _Recording(broker)
    app = _eos_app(clients, consumer_overrides={"session.timeout.ms": 10_000})
    app.provision()
    app.start(main=True)
    try:
        deadline = time.monotonic() + 10
        while not (clients.producers and clients.consumers) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        assert app.stop(10)
    assert app.max_poll_interval_ms == EXACTLY_ONCE_MAX_POLL_INTERVAL_MS
    assert clients.producers[0] == ("billing-billing-0", {"transaction.timeout.ms": 30_000})
    assert clients.consumers[0]["max.poll.interval.ms"] == 20_000

    # librdkafka's 45 s session: the poll interval may not be shorter, and the transaction timeout follows it
    default_session = _eos_app(MemoryClientFactory(broker))
    assert default_session._eos == ({"max.poll.interval.ms": 45_000}, {"transaction.timeout.ms": 55_000})
    slower = _eos_app(MemoryClientFactory(broker), consumer_overrides={"max.poll.interval.ms": 60_000})
    assert slower._eos == ({"max.poll.interval.ms": 60_000}, {"transaction.timeout.ms": 70_000})


def test_a_transaction_timeout_shorter_than_a_batch_and_its_commit_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError) as refused:
        RetryApp(kafka=KAFKA, group="billing", exactly_once=True, producer_overrides={"transaction.timeout.ms": 25_000})
    assert refused.value.field == "transaction.timeout.ms"
    # at-least-once has no transaction: nothing to check
    RetryApp(kafka=KAFKA, group="billing", producer_overrides={"transaction.timeout.ms": 25_000})


def test_two_running_apps_of_one_process_never_share_a_transactional_id() -> None:
    broker = MemoryBroker()
    broker.create_topic("orders")
    first = _eos_app(MemoryClientFactory(broker), instance_id="replica-1")
    first.provision()
    first.start(main=True)
    try:
        with pytest.raises(ConfigError) as refused:
            _eos_app(MemoryClientFactory(broker), instance_id="replica-1").start(main=True)
        assert refused.value.field == "instance_id" and "billing-replica-1" in refused.value.reason
        other = _eos_app(MemoryClientFactory(broker), instance_id="replica-2")
        other.start(main=True)
        assert other.stop(10)
    finally:
        assert first.stop(10)
    again = _eos_app(MemoryClientFactory(broker), instance_id="replica-1")  # the first one stopped: free again
    again.start(main=True)
    assert again.stop(10)
