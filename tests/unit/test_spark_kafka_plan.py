"""The pure planning rules of the Spark Kafka data source (no Spark, no broker)."""

from __future__ import annotations

import pytest

from retrytopics.connectors.spark_kafka_plan import (
    OffsetRange,
    Subscription,
    allocate_limit,
    client_properties,
    offsets_from_json,
    offsets_to_json,
    parse_offset_spec,
    plan_ranges,
    resolve_offsets,
    resolve_timestamps,
    split_ranges,
    subscription_from_options,
    timestamp_spec,
)
from retrytopics.core.errors import ConfigError

BOOT = {"kafka.bootstrap.servers": "b:9092"}


def test_client_properties_strip_the_prefix_and_refuse_what_spark_and_we_refuse() -> None:
    assert client_properties({**BOOT, "kafka.fetch.max.bytes": "1", "subscribe": "t"}) == {
        "bootstrap.servers": "b:9092",
        "fetch.max.bytes": "1",
    }
    for refused in (
        "auto.offset.reset",
        "enable.auto.commit",
        "value.deserializer",
        "plugin.library.paths",
        "ssl.engine.location",
        "ssl.providers",
        "sasl.kerberos.kinit.cmd",
        "sasl.jaas.config",
    ):
        with pytest.raises(ConfigError, match=f"kafka.{refused}"):
            client_properties({**BOOT, f"kafka.{refused}": "x"})
    with pytest.raises(ConfigError, match=r"bootstrap\.servers"):
        client_properties({"subscribe": "t"})


def test_exactly_one_subscription_option() -> None:
    assert subscription_from_options({"subscribe": "a, b"}).topics == ("a", "b")
    assert subscription_from_options({"SubscribePattern": "a.*"}).pattern == "a.*"
    assert subscription_from_options({"assign": '{"t":[1,0]}'}).assigned == (("t", 1), ("t", 0))
    for bad in ({}, {"subscribe": "a", "assign": '{"a":[0]}'}, {"assign": "[0]"}, {"subscribePattern": "("}):
        with pytest.raises(ConfigError):
            subscription_from_options(bad)


def test_subscription_selects_partitions_from_metadata() -> None:
    counts = {"orders": 2, "orders.g.dlq": 1, "other": 3}
    assert Subscription("subscribe", topics=("orders", "missing")).select(counts) == [("orders", 0), ("orders", 1)]
    assert Subscription("subscribePattern", pattern=r"orders.*").select(counts) == [
        ("orders", 0),
        ("orders", 1),
        ("orders.g.dlq", 0),
    ]
    with pytest.raises(ConfigError, match="no such topic-partition"):
        Subscription("assign", assigned=(("orders", 5),)).select(counts)


def test_offset_specs_and_json_round_trip() -> None:
    assert parse_offset_spec(None, which="startingOffsets", default="earliest") == "earliest"
    assert parse_offset_spec(" LATEST ", which="endingOffsets", default="latest") == "latest"
    offsets = offsets_from_json('{"t":{"0":23,"1":-2}}', field="x")
    assert offsets == {("t", 0): 23, ("t", 1): -2}
    assert offsets_from_json(offsets_to_json(offsets), field="x") == offsets
    with pytest.raises(ConfigError, match="endingOffsets"):
        parse_offset_spec('{"t":{"0":-2}}', which="endingOffsets", default="latest")
    with pytest.raises(ConfigError):
        parse_offset_spec("tomorrow", which="startingOffsets", default="earliest")


def test_resolve_offsets_replaces_sentinels_with_watermarks() -> None:
    wm = {("t", 0): (2, 10), ("t", 1): (0, 5)}
    tps = sorted(wm)
    assert resolve_offsets("earliest", tps, wm, which="s") == {("t", 0): 2, ("t", 1): 0}
    assert resolve_offsets({("t", 0): -1, ("t", 1): 3}, tps, wm, which="s") == {("t", 0): 10, ("t", 1): 3}
    with pytest.raises(ConfigError, match="every partition"):
        resolve_offsets({("t", 0): 3}, tps, wm, which="s")


def test_timestamp_options_win_and_resolve_like_spark() -> None:
    assert timestamp_spec({"startingTimestamp": "1000", "startingOffsetsByTimestamp": "{}"}, "starting") == 1000
    assert timestamp_spec({"endingOffsetsByTimestamp": '{"t":{"0":5}}'}, "ending") == {("t", 0): 5}
    assert timestamp_spec({}, "starting") is None
    tps = [("t", 0), ("t", 1)]
    # the broker found offset 7 for partition 0 and nothing (-1) for partition 1
    assert resolve_timestamps(1000, tps, {("t", 0): 7, ("t", 1): -1}, which="endingTimestamp") == {
        ("t", 0): 7,
        ("t", 1): -1,
    }
    with pytest.raises(ConfigError, match="no offset has a timestamp"):
        resolve_timestamps(1000, tps, {("t", 0): 7, ("t", 1): -1}, which="startingTimestamp")
    assert resolve_timestamps(1000, tps, {("t", 0): 7}, which="startingTimestamp", strategy="latest")[("t", 1)] == -1


def test_ranges_outside_the_log_are_errors_or_clamped() -> None:
    wm = {("t", 0): (10, 20)}
    assert plan_ranges({("t", 0): 12}, {("t", 0): 20}, wm) == [OffsetRange("t", 0, 12, 20)]
    with pytest.raises(ConfigError, match=r"beyond the high watermark; the log holds \[10, 20\)"):
        plan_ranges({("t", 0): 12}, {("t", 0): 25}, wm)
    with pytest.raises(ConfigError, match="before the log start"):
        plan_ranges({("t", 0): 3}, {("t", 0): 20}, wm)
    assert plan_ranges({("t", 0): 3}, {("t", 0): 25}, wm, fail_on_data_loss=False) == [OffsetRange("t", 0, 10, 20)]
    with pytest.raises(ConfigError, match="start is after"):
        plan_ranges({("t", 0): 15}, {("t", 0): 12}, wm, fail_on_data_loss=False)


def test_split_ranges_cover_the_same_offsets() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 5, 5), OffsetRange("t", 2, 0, 10)]
    capped = split_ranges(ranges, max_records=30)
    assert max(r.size for r in capped) <= 30 and len(capped) == 4 + 1 + 1
    spread = split_ranges(ranges, min_partitions=11)
    assert len(spread) >= 11
    for pieces in (capped, spread):
        offsets = sorted((r.partition, o) for r in pieces for o in range(r.start, r.end))
        assert offsets == sorted((r.partition, o) for r in ranges for o in range(r.start, r.end))


def test_allocate_limit_shares_in_proportion_to_lag() -> None:
    start = {("t", 0): 0, ("t", 1): 90}
    latest = {("t", 0): 100, ("t", 1): 100, ("t", 2): 10}
    assert allocate_limit(start, latest, None) == latest
    ends = allocate_limit(start, latest, 60)
    assert ends == {("t", 0): 50, ("t", 1): 95, ("t", 2): 5}
    assert sum(ends[tp] - start.get(tp, 0) for tp in ends) <= 60
    assert allocate_limit(start, latest, 1)[("t", 1)] == 91  # a share below one record rounds up
