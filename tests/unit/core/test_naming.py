"""Topic naming: strategies, Kafka's name rules, and lookups."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.errors import ConfigError
from retrytopics.core.naming import NamingStrategy, TierTopic, TopicSet, topics_for, validate_topic_name
from retrytopics.core.policy import RetryPolicy


def test_by_delay_is_the_default() -> None:
    ts = topics_for("orders", "billing", (500, 30_000, 5_400_000))
    assert [t.topic for t in ts.tiers] == [
        "orders.billing.retry.500ms",
        "orders.billing.retry.30s",
        "orders.billing.retry.1h30m",
    ]
    assert ts.dlq == "orders.billing.dlq"
    assert ts.all_topics == (*(t.topic for t in ts.tiers), "orders.billing.dlq")
    assert [t.index for t in ts.tiers] == [0, 1, 2]


def test_by_index_and_shared() -> None:
    by_index = topics_for("orders", "billing", (5_000, 30_000), strategy=NamingStrategy.BY_INDEX)
    assert [t.topic for t in by_index.tiers] == ["orders.billing.retry.0", "orders.billing.retry.1"]
    shared = topics_for("orders", "billing", (5_000,), strategy="shared")  # type: ignore[arg-type]
    assert shared.all_topics == ("billing.retry.5s", "billing.dlq")
    assert shared.strategy is NamingStrategy.SHARED


def test_the_key_state_topic_is_named_like_the_dlq_and_kept_out_of_all_topics() -> None:
    """`<topic>.<group>.keys` (`<group>.keys` when shared), whatever the DLQ is called; never in `all_topics`
    (provisioned only for a key-ordered handler)."""
    by_delay = topics_for("orders", "billing", (5_000,), dlq="parking")
    assert by_delay.key_state_topic == "orders.billing.keys"
    assert by_delay.key_state_topic not in by_delay.all_topics
    by_index = topics_for("orders", "billing", (5_000,), strategy=NamingStrategy.BY_INDEX)
    assert by_index.key_state_topic == "orders.billing.keys"
    assert topics_for("orders", "billing", (5_000,), strategy=NamingStrategy.SHARED).key_state_topic == "billing.keys"


def test_dlq_override_and_lookups() -> None:
    ts = topics_for("orders", "billing", RetryPolicy().tier_delays_ms, dlq="parking")
    assert ts.dlq == "parking"
    assert ts.tier_by_topic("orders.billing.retry.30s") == TierTopic(
        index=1, delay_ms=30_000, topic="orders.billing.retry.30s"
    )
    assert ts.tier_by_topic("orders") is None
    assert ts.tier_by_delay(300_000).index == 2
    with pytest.raises(ConfigError) as info:
        ts.tier_by_delay(1)
    assert info.value.field == "delay_ms" and info.value.value == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "field"),
    [
        (("orders", "billing", (5_000, 5_000)), {}, "tier_delays_ms[1]"),
        (("orders", "billing", (30_000, 5_000)), {}, "tier_delays_ms[1]"),
        (("orders", "billing", (-1,)), {}, "tier_delays_ms[0]"),
        (("orders", "billing", ("5s",)), {}, "tier_delays_ms[0]"),
        (("ord ers", "billing", (1,)), {}, "source"),
        (("orders", "bill/ing", (1,)), {}, "group"),
        (("orders", "billing", (1,)), {"dlq": ".."}, "dlq"),
        (("orders", "billing", (1,)), {"strategy": "by_color"}, "strategy"),
        (("o" * 240, "billing", (1,)), {}, "tiers[0].topic"),
        (("orders", "billing", (1,)), {"dlq": "orders"}, "topics"),
    ],
)
def test_errors_name_the_field(args: tuple[object, ...], kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        topics_for(*args, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize("bad", ["", ".", "..", "a b", "ü", "a/b", "x" * 250, "tab\t"])
def test_illegal_topic_names(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_topic_name(bad, field="topic")
    assert info.value.field == "topic" and info.value.value == bad


@pytest.mark.parametrize("good", ["a", "...", "a.b_c-D9", "x" * 249])
def test_legal_topic_names(good: str) -> None:
    assert validate_topic_name(good, field="topic") == good


def test_topic_set_checks_its_own_invariants() -> None:
    with pytest.raises(ConfigError) as info:
        TopicSet(source="s", group="g", tiers=(TierTopic(index=1, delay_ms=1, topic="t"),), dlq="d")
    assert info.value.field == "tiers[0].index"


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=30, unique=True))
def test_names_are_distinct_legal_and_one_per_delay(delays: list[int]) -> None:
    delays.sort()
    for strategy in NamingStrategy:
        ts = topics_for("orders", "billing", delays, strategy=strategy)
        assert len(set(ts.all_topics)) == len(delays) + 1
        for topic in ts.all_topics:
            assert validate_topic_name(topic, field="t") == topic
        assert all(ts.tier_by_delay(d).delay_ms == d for d in delays)
