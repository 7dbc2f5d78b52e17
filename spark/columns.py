"""Typed columns from Kafka rows: retry headers → typed columns, Avro values → struct columns.

Header decoding is plain Spark SQL (no Python UDF, so it costs no serialization): each `retry.*` header
becomes one typed column, and a header that is missing, duplicated or not a canonical number reads as NULL
(a bad header never fails a job; `retry.dlq_reason = invalid_retry_headers` tells that story)::

    df = with_retry_columns(read_kafka(spark, {..., "includeHeaders": "true"}))
    df.groupBy("dlq_reason", "exception_type").count()

Avro decoding runs fastavro in an Arrow-optimised Python UDF; a value that does not decode reads as NULL::

    orders = with_avro_value(df, load_schema("order.avsc"), wire="confluent")
    orders.select("avro.order_id", "avro.amount_cents")
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from retrytopics.core import headers as H
from retrytopics.core.errors import ConfigError

__all__ = [
    "RETRY_COLUMNS",
    "avro_to_spark_type",
    "header_bytes",
    "header_text",
    "load_schema",
    "retry_columns",
    "typed_header",
    "with_avro_value",
    "with_retry_columns",
]

#: Typed column name → (header, kind). kind: text, int, long, time (epoch ms → timestamp).
RETRY_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "schema_version": (H.SCHEMA_VERSION, "int"),
    "reconsume_times": (H.RECONSUME_TIMES, "int"),
    "origin_message_id": (H.ORIGIN_MESSAGE_ID, "text"),
    "original_topic": (H.ORIGINAL_TOPIC, "text"),
    "original_partition": (H.ORIGINAL_PARTITION, "int"),
    "original_offset": (H.ORIGINAL_OFFSET, "long"),
    "original_timestamp": (H.ORIGINAL_TIMESTAMP, "time"),
    "consumer_group": (H.CONSUMER_GROUP, "text"),
    "tier": (H.TIER, "int"),
    "due_at": (H.DUE_AT, "time"),
    "first_failed_at": (H.FIRST_FAILED_AT, "time"),
    "last_failed_at": (H.LAST_FAILED_AT, "time"),
    "exception_type": (H.EXCEPTION_TYPE, "text"),
    "exception_message": (H.EXCEPTION_MESSAGE, "text"),
    "dlq_reason": (H.DLQ_REASON, "text"),
    "replay_id": (H.REPLAY_ID, "text"),
    "replayed_at": (H.REPLAYED_AT, "time"),
    "replay_count": (H.REPLAY_COUNT, "int"),
    "replay_origin_id": (H.REPLAY_ORIGIN_ID, "text"),
}


_MIN_MS: Final = -62_135_596_800_000  # 0001-01-01T00:00:00Z
_MAX_MS: Final = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _header_bytes_sql(key: str, headers: str) -> str:
    keys, wanted = f"{_sql_name(headers)}.key", _sql_string(key)
    occurrences = f"size({keys}) - size(array_remove({keys}, {wanted}))"
    position = f"CAST(array_position({keys}, {wanted}) AS INT)"
    return f"CASE WHEN {occurrences} = 1 THEN element_at({_sql_name(headers)}.value, {position}) END"


def _typed_sql(text: str, kind: str) -> str:
    """`text` (an SQL expression of the header's text) as `kind`; a number must be canonical: it must read back
    as the same text (no sign, leading zero, space or exponent), which a regular expression checked before at
    several times the cost."""
    if kind == "text":
        return text
    number = f"CASE WHEN CAST(try_cast({text} AS BIGINT) AS STRING) = {text} THEN try_cast({text} AS BIGINT) END"
    if kind == "int":
        return f"try_cast({number} AS INT)"
    if kind == "long":
        return number
    # Beyond Spark's timestamp range (years 1..9999) timestamp_millis fails the whole query
    # (DATETIME_OVERFLOW): a forged `retry.due_at = 2^63-1` stopped every audit. Such a time reads as NULL.
    return f"CASE WHEN {number} BETWEEN {_MIN_MS} AND {_MAX_MS} THEN timestamp_millis({number}) END"


# The columns are built from SQL text: one JVM call per column instead of a dozen (building the 19 columns
# through the functions API took about 0.5 s of py4j round trips per DataFrame). Header lookups use
# array_remove/array_position rather than a lambda (`filter(headers, h -> ...)`).


def header_bytes(key: str, headers: str = "headers") -> Column:
    """The value of header `key`, or NULL when it is absent or present more than once (ambiguous)."""
    return F.expr(_header_bytes_sql(key, headers))


def header_text(key: str, headers: str = "headers") -> Column:
    """`header_bytes` decoded as UTF-8."""
    return F.expr(f"CAST({_header_bytes_sql(key, headers)} AS STRING)")


def typed_header(key: str, kind: str, headers: str = "headers") -> Column:
    """Header `key` as `kind` (text, int, long, time), by the rules of `RETRY_COLUMNS`: NULL when absent,
    repeated or not canonical."""
    return F.expr(_typed_sql(f"CAST({_header_bytes_sql(key, headers)} AS STRING)", kind))


def retry_columns(headers: str = "headers", *, exclude_trace: bool = True) -> list[Column]:
    """One typed column per retry header (see RETRY_COLUMNS), plus `exception_trace` unless excluded."""
    columns = [
        F.expr(_typed_sql(f"CAST({_header_bytes_sql(key, headers)} AS STRING)", kind)).alias(name)
        for name, (key, kind) in RETRY_COLUMNS.items()
    ]
    if not exclude_trace:
        columns.append(header_text(H.EXCEPTION_TRACE, headers).alias("exception_trace"))
    return columns


def with_retry_columns(df: DataFrame, headers: str = "headers", *, exclude_trace: bool = True) -> DataFrame:
    """`df` plus the typed retry columns; it needs a `headers` column (read with includeHeaders=true).

    Three projections: a map of the headers when no key repeats (the usual case), then each header's text
    (a map lookup; a scan of the keys only for a record with a repeated key), then the typed values. One
    expression per column would look each header up several times per row and be too big to compile."""
    if headers not in df.columns:
        raise ConfigError("headers", headers, "no such column: read Kafka with includeHeaders=true")
    wanted = {**RETRY_COLUMNS, **({} if exclude_trace else {"exception_trace": (H.EXCEPTION_TRACE, "text")})}
    keys = f"{_sql_name(headers)}.key"
    by_key = F.expr(
        f"CASE WHEN size(array_distinct({keys})) = size({keys}) "
        f"THEN map_from_arrays({keys}, {_sql_name(headers)}.value) END"
    ).alias("__retry_map")
    texts = [
        F.expr(
            f"CAST(CASE WHEN __retry_map IS NOT NULL THEN try_element_at(__retry_map, {_sql_string(key)}) "
            f"ELSE {_header_bytes_sql(key, headers)} END AS STRING)"
        ).alias(f"__retry_{name}")
        for name, (key, _) in wanted.items()
    ]
    typed = [F.expr(_typed_sql(_sql_name(f"__retry_{name}"), kind)).alias(name) for name, (_, kind) in wanted.items()]
    original = [_sql_name(c) for c in df.columns]
    return df.select("*", by_key).select(*original, *texts).select(*original, *typed)


def load_schema(name: str) -> dict[str, Any]:
    """An Avro schema shipped in `schemas/` (e.g. "order.avsc"), as parsed JSON."""
    text = resources.files("retrytopics.schemas").joinpath(name).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


_PRIMITIVES: Final[dict[str, DataType]] = {
    "null": StringType(),
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
_LOGICAL: Final[dict[str, DataType]] = {
    "timestamp-millis": TimestampType(),
    "timestamp-micros": TimestampType(),
    "date": DateType(),
}


def avro_to_spark_type(schema: Any, named: dict[str, DataType] | None = None) -> DataType:
    """The Spark type of an Avro schema: records → structs, enums → strings, unions with null → nullable;
    timestamp-millis/micros → timestamp, date → date. Other unions are refused."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named or schema.split(".")[-1] in named:
            return named.get(schema) or named[schema.split(".")[-1]]
        raise ConfigError("schema", schema, "unknown Avro type name")
    if isinstance(schema, list):
        branches = [s for s in schema if s != "null"]
        if len(branches) != 1:
            raise ConfigError("schema", schema, "only unions of null and one type map to a Spark column")
        return avro_to_spark_type(branches[0], named)
    kind, logical = schema.get("type"), schema.get("logicalType")
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    if kind == "record":
        struct = StructType([StructField(f["name"], avro_to_spark_type(f["type"], named)) for f in schema["fields"]])
        named[schema["name"]] = struct
        return struct
    if kind in ("enum", "fixed"):
        named[schema["name"]] = StringType() if kind == "enum" else BinaryType()
        return named[schema["name"]]
    if kind == "array":
        return ArrayType(avro_to_spark_type(schema["items"], named))
    if kind == "map":
        return MapType(StringType(), avro_to_spark_type(schema["values"], named))
    return avro_to_spark_type(kind, named)


def with_avro_value(
    df: DataFrame,
    schema: Mapping[str, Any] | Sequence[Any] | str,
    *,
    column: str = "value",
    alias: str = "avro",
    wire: str = "plain",
    schema_id: int | None = None,
) -> DataFrame:
    """`df` plus `alias`: `column` decoded with the Avro writer `schema` (plain, or Confluent wire format
    with the 5-byte header). Undecodable values become NULL; count them with `avro IS NULL AND value IS NOT NULL`."""
    from retrytopics.connectors.serde import avro

    parsed = json.loads(schema) if isinstance(schema, str) else schema
    avro(parsed, wire=wire, schema_id=schema_id)  # type: ignore[arg-type]  # fail fast on the driver
    spark_type = avro_to_spark_type(parsed)
    built: list[Any] = []  # the decoder is built once per Python worker: closures over it do not pickle

    def decode_or_null(data: bytes | None) -> Any:
        if not built:
            built.append(avro(parsed, wire=wire, schema_id=schema_id))  # type: ignore[arg-type]
        try:
            return built[0](data)
        except Exception:  # noqa: BLE001 - a poison value reads as NULL, it must not fail the audit
            return None

    udf = F.udf(decode_or_null, spark_type, useArrow=True)
    return df.withColumn(alias, udf(F.col(column)))
