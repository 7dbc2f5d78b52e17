"""Avro → Spark type mapping (pyspark types only, no session)."""

from __future__ import annotations

import pytest
from pyspark.sql.types import ArrayType, LongType, MapType, StringType, StructType, TimestampType

from retrytopics.core.errors import ConfigError
from retrytopics.spark.columns import RETRY_COLUMNS, avro_to_spark_type, load_schema


def test_order_schema_maps_to_a_struct() -> None:
    struct = avro_to_spark_type(load_schema("order.avsc"))
    assert isinstance(struct, StructType)
    fields = {f.name: f.dataType for f in struct.fields}
    assert fields["amount_cents"] == LongType() and fields["currency"] == StringType()
    assert fields["created_at"] == TimestampType()
    assert isinstance(fields["items"], ArrayType) and isinstance(fields["items"].elementType, StructType)


def test_nullable_unions_maps_and_named_references() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "a", "type": ["null", "string"]},
            {"name": "m", "type": {"type": "map", "values": "long"}},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
            {"name": "e2", "type": "E"},
        ],
    }
    fields = {f.name: f.dataType for f in avro_to_spark_type(schema).fields}  # type: ignore[attr-defined]
    assert fields == {"a": StringType(), "m": MapType(StringType(), LongType()), "e": StringType(), "e2": StringType()}
    with pytest.raises(ConfigError, match="unions"):
        avro_to_spark_type(["int", "string"])


def test_every_retry_header_has_a_typed_column() -> None:
    from retrytopics.core import headers

    names = {
        getattr(headers, n)
        for n in headers.__all__
        if isinstance(getattr(headers, n), str) and getattr(headers, n).startswith("retry.")
    }
    assert names - {key for key, _ in RETRY_COLUMNS.values()} == {"retry.exception_trace", "retry."}
