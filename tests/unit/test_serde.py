"""Deserializers decode what their serializers wrote, keep Kafka nulls, and every decode failure becomes a
PoisonRecordError that carries the raw bytes."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.connectors.serde import (
    avro,
    avro_serializer,
    bytes_value,
    deserialize,
    json_serializer,
    json_value,
    utf8,
)
from retrytopics.core.errors import ConfigError, PoisonRecordError

ORDER = json.loads((Path(__file__).parents[2] / "schemas" / "order.avsc").read_text())
AN_ORDER = {
    "order_id": "o-1",
    "customer_id": "c-9",
    "amount_cents": 1250,
    "currency": "EUR",
    "created_at": 1_700_000_000_000,
    "items": [{"sku": "A-1", "quantity": 2}],
}
#: What fastavro reads back: the timestamp-millis logical type becomes an aware datetime.
AN_ORDER_READ = {**AN_ORDER, "created_at": datetime.fromtimestamp(1_700_000_000, tz=UTC)}


def _poison(deserializer, data):  # type: ignore[no-untyped-def]
    with pytest.raises(PoisonRecordError) as info:
        deserialize(deserializer, data, topic="orders", partition=2, offset=41)
    return info.value


def test_bytes_and_utf8() -> None:
    assert bytes_value(b"\x00\xff") == b"\x00\xff"
    assert utf8("ünï".encode()) == "ünï"
    error = _poison(utf8, b"\xff\xfe")
    assert (error.topic, error.partition, error.offset, error.raw) == ("orders", 2, 41, b"\xff\xfe")
    assert isinstance(error.cause, UnicodeDecodeError)


@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=10,
    )
)
def test_json_round_trip(value: object) -> None:
    assert json_value(json_serializer(value)) == value


@pytest.mark.parametrize("data", [b"not json", b'{"a": NaN}', b"\xff", b'{"a": 1'])
def test_json_garbage_is_poison(data: bytes) -> None:
    assert _poison(json_value, data).raw == data


def test_nulls_stay_null() -> None:
    for deserializer in (bytes_value, utf8, json_value, avro(ORDER), avro(ORDER, wire="confluent")):
        assert deserialize(deserializer, None, topic="t", partition=0, offset=0) is None


def test_avro_schemaless_round_trip() -> None:
    data = avro_serializer(ORDER)(AN_ORDER, None)
    assert avro(ORDER)(data, None) == AN_ORDER_READ


def test_avro_confluent_wire_format_round_trip_and_checks() -> None:
    data = avro_serializer(ORDER, wire="confluent", schema_id=7)(AN_ORDER, None)
    assert data[:5] == struct.pack(">bI", 0, 7)
    assert avro(ORDER, wire="confluent", schema_id=7)(data, None) == AN_ORDER_READ
    assert avro(ORDER, wire="confluent")(data, None) == AN_ORDER_READ  # any id accepted when none is pinned
    assert "schema id 7" in str(_poison(avro(ORDER, wire="confluent", schema_id=8), data))
    assert "magic byte" in str(_poison(avro(ORDER, wire="confluent"), b"\x01" + data[1:]))
    assert "too short" in str(_poison(avro(ORDER, wire="confluent"), b"\x00\x00"))


def test_avro_rejects_bytes_written_with_another_schema() -> None:
    good = avro_serializer(ORDER)(AN_ORDER, None)
    assert "trailing" in str(_poison(avro(ORDER), good + b"\x00\x00"))
    _poison(avro(ORDER), b"\x02")  # truncated body
    _poison(avro(ORDER), avro_serializer(ORDER, wire="confluent", schema_id=1)(AN_ORDER, None))


def test_avro_configuration_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="schema"):
        avro({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})
    with pytest.raises(ConfigError, match="wire"):
        avro(ORDER, wire="protobuf")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="schema_id"):
        avro_serializer(ORDER, wire="confluent")


def test_any_exception_from_a_custom_deserializer_is_poison() -> None:
    def broken(data: bytes | None, ctx: object) -> object:
        raise KeyError("boom")

    error = _poison(broken, b"x")
    assert isinstance(error.cause, KeyError) and error.__cause__ is error.cause


def test_context_carries_topic_and_headers() -> None:
    seen = []
    deserialize(
        lambda data, ctx: seen.append((ctx.topic, ctx.headers)),
        b"x",
        topic="orders",
        partition=0,
        offset=0,
        headers=[("h", b"1")],
    )
    assert seen == [("orders", [("h", b"1")])]
