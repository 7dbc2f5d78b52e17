"""Signed retry headers in the replay: verify DLQ records, sign what goes to a tier.

With header keys (`retrytopics.core.signing`), a DLQ record whose `retry.signature` is missing or does not verify
for its DLQ topic is skipped by the replay with the problem `signature`, and a record replayed to the first
tier is signed for that tier (the tier consumers refuse unsigned records). The keys travel to the executors
inside the pickled Python functions, never as SQL literals: a literal would show in the query plan (Spark UI,
`explain()`, logs). Python UDFs cost a round trip to a Python worker per batch of rows: measured in
docs/headers.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StringType

from retrytopics.core.signing import SIGNATURE, HeaderKeys, sign, verify, verify_state

__all__ = ["signature", "state_verified", "verified"]


def _pairs(headers: Iterable[Any] | None) -> list[tuple[str, bytes | None]]:
    return [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in headers or ()]


def _bytes(data: Any) -> bytes | None:
    return None if data is None else bytes(data)


def verified(keys: HeaderKeys, topic: Column, key: Column, value: Column, headers: Column) -> Column:
    """True when the record's signature verifies for `topic` with one of `keys` (never NULL)."""

    def check(topic: str, key: Any, value: Any, headers: Any) -> bool:
        return verify(keys, topic, _bytes(key), _bytes(value), _pairs(headers)) is None

    return F.udf(check, BooleanType(), useArrow=False)(topic, key, value, headers)


def state_verified(keys: HeaderKeys, topic: Column, key: Column, value: Column, headers: Column) -> Column:
    """True when a key-state record's signature (`core.signing.verify_state`) verifies for `topic` (never NULL)."""

    def check(topic: str, key: Any, value: Any, headers: Any) -> bool:
        return verify_state(keys, topic, _bytes(key), _bytes(value), _pairs(headers)) is None

    return F.udf(check, BooleanType(), useArrow=False)(topic, key, value, headers)


def signature(keys: HeaderKeys, topic: Column, key: Column, value: Column, headers: Column) -> Column:
    """The `retry.signature` header (a struct like the others) for a record written to `topic`."""

    def mac(topic: str, key: Any, value: Any, headers: Any) -> str:
        return (sign(keys, topic, _bytes(key), _bytes(value), _pairs(headers))[-1][1] or b"").decode("ascii")

    value_column = F.udf(mac, StringType(), useArrow=False)(topic, key, value, headers)
    return F.struct(F.lit(SIGNATURE).alias("key"), value_column.cast("binary").alias("value"))
