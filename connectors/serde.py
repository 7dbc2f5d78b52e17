"""Value and key (de)serializers in confluent-kafka's shape: callables `(data, ctx) -> value`.

Any CK deserializer (`confluent_kafka.schema_registry.avro.AvroDeserializer`, a `StringDeserializer`, ...) works
as a handler's `value_deserializer` too; these cover the common cases without a schema registry::

    app.handler("orders", value_deserializer=json_value)                  # bytes -> object
    app.handler("orders", value_deserializer=avro(ORDER_SCHEMA))          # schemaless Avro (fastavro)
    app.handler("orders", value_deserializer=avro(ORDER_SCHEMA, wire="confluent", schema_id=7))

Decoding untrusted bytes never evaluates or imports anything: JSON is parsed as data, Avro by a fixed writer
schema. A Kafka null stays None. `deserialize()` is how the runtime calls them: any decoder error becomes a
`PoisonRecordError` carrying the raw bytes, and the record goes to the DLQ with reason `poison`.
"""

from __future__ import annotations

import io
import json as _json
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import fastavro
from confluent_kafka.serialization import MessageField, SerializationContext

from retrytopics.connectors.avro_bounds import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ITEMS, bounds_check
from retrytopics.core.errors import ConfigError, PoisonRecordError

__all__ = [
    "Deserializer",
    "Serializer",
    "avro",
    "avro_serializer",
    "bytes_value",
    "deserialize",
    "json_serializer",
    "json_value",
    "utf8",
]

#: `(data, ctx) -> value`; `ctx` is a `SerializationContext` (topic, field, headers), possibly None.
Deserializer: TypeAlias = Callable[[bytes | None, Any], Any]
#: `(value, ctx) -> bytes | None`.
Serializer: TypeAlias = Callable[[Any, Any], bytes | None]

_CONFLUENT_MAGIC = 0
_CONFLUENT_HEADER = struct.Struct(">bI")


class DecodeError(ValueError):
    """A deserializer could not decode the bytes (the runtime wraps it in `PoisonRecordError`)."""


def bytes_value(data: bytes | None, ctx: Any = None) -> bytes | None:
    """The raw bytes, unchanged (the default)."""
    return data


def utf8(data: bytes | None, ctx: Any = None) -> str | None:
    """Strict UTF-8 text: invalid bytes are a decode error, never replaced silently."""
    return None if data is None else data.decode("utf-8")


def json_value(data: bytes | None, ctx: Any = None) -> Any:
    """JSON (RFC 8259; `NaN`/`Infinity` refused) from UTF-8 bytes."""
    if data is None:
        return None
    return _json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise DecodeError(f"{name} is not JSON")


def json_serializer(value: Any, ctx: Any = None) -> bytes | None:
    """Compact UTF-8 JSON; None stays a Kafka null."""
    return None if value is None else _json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _parse_schema(schema: str | Mapping[str, Any] | Sequence[Any]) -> Any:
    try:
        loaded = _json.loads(schema) if isinstance(schema, str) else schema
        return fastavro.parse_schema(loaded)  # type: ignore[arg-type]
    except Exception as exc:
        raise ConfigError("schema", "<avro schema>", f"not a valid Avro schema: {exc}") from exc


def _check_wire(wire: str, schema_id: int | None) -> None:
    if wire not in ("plain", "confluent"):
        raise ConfigError("wire", wire, "expected 'plain' (schemaless) or 'confluent' (magic byte + schema id)")
    if schema_id is not None and (wire != "confluent" or not 0 <= schema_id < 2**31):
        raise ConfigError("schema_id", schema_id, "a 31-bit id, only with wire='confluent'")


def avro(
    schema: str | Mapping[str, Any] | Sequence[Any],
    *,
    wire: Literal["plain", "confluent"] = "plain",
    schema_id: int | None = None,
    reader_schema: str | Mapping[str, Any] | None = None,
    max_items: int = DEFAULT_MAX_ITEMS,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Deserializer:
    """An Avro deserializer for one writer schema (fastavro, no registry).

    `wire="confluent"` expects Confluent's framing (magic byte 0, a 4-byte big-endian schema id, then the body)
    and, when `schema_id` is given, refuses other ids. Trailing bytes after the body are a decode error: they
    mean the bytes were written with another schema.

    Hostile values are decode errors, found before decoding: with a schema whose arrays hold items that take
    no bytes (`array<null>`), more than `max_items` of them; with a recursive schema, nesting deeper than
    `max_depth`; any block count larger than the bytes left can hold (see connectors/avro_bounds.py).
    """
    _check_wire(wire, schema_id)
    for name, limit in (("max_items", max_items), ("max_depth", max_depth)):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(name, limit, "expected an int >= 1")
    writer = _parse_schema(schema)
    reader = _parse_schema(reader_schema) if reader_schema is not None else None
    check_bounds = bounds_check(writer, max_items=max_items, max_depth=max_depth)

    def deserialize_avro(data: bytes | None, ctx: Any = None) -> Any:
        if data is None:
            return None
        body = memoryview(data)
        if wire == "confluent":
            if len(data) < _CONFLUENT_HEADER.size:
                raise DecodeError(f"{len(data)} bytes: too short for the Confluent wire format header")
            magic, found_id = _CONFLUENT_HEADER.unpack_from(data)
            if magic != _CONFLUENT_MAGIC:
                raise DecodeError(f"magic byte {magic}, expected {_CONFLUENT_MAGIC} (Confluent wire format)")
            if schema_id is not None and found_id != schema_id:
                raise DecodeError(f"schema id {found_id}, expected {schema_id}")
            body = body[_CONFLUENT_HEADER.size :]
        if check_bounds is not None:
            check_bounds(body)
        stream = io.BytesIO(body)
        value = fastavro.schemaless_reader(stream, writer, reader)
        if stream.tell() != len(body):
            raise DecodeError(f"{len(body) - stream.tell()} trailing bytes after the Avro body")
        return value

    return deserialize_avro


def avro_serializer(
    schema: str | Mapping[str, Any] | Sequence[Any],
    *,
    wire: Literal["plain", "confluent"] = "plain",
    schema_id: int | None = None,
) -> Serializer:
    """The matching serializer (for producers, tests and the demo)."""
    _check_wire(wire, schema_id)
    if wire == "confluent" and schema_id is None:
        raise ConfigError("schema_id", schema_id, "the Confluent wire format needs the registry's schema id")
    writer = _parse_schema(schema)

    def serialize_avro(value: Any, ctx: Any = None) -> bytes | None:
        if value is None:
            return None
        out = io.BytesIO()
        if wire == "confluent":
            out.write(_CONFLUENT_HEADER.pack(_CONFLUENT_MAGIC, schema_id))
        fastavro.schemaless_writer(out, writer, value)
        return out.getvalue()

    return serialize_avro


def deserialize(
    deserializer: Deserializer,
    data: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    headers: Sequence[tuple[str, bytes | None]] = (),
    key: bool = False,
) -> Any:
    """Run `deserializer` on one record's value (or key); any error becomes a `PoisonRecordError`."""
    ctx = SerializationContext(topic, MessageField.KEY if key else MessageField.VALUE, list(headers))
    try:
        return deserializer(data, ctx)
    except Exception as exc:
        raise PoisonRecordError(topic, partition, offset, data, exc) from exc
