"""The Avro schemas of the header contract: they parse, they match the code, and real values validate."""

from __future__ import annotations

import dataclasses
import io
import json
import random
from importlib.resources import files
from typing import Any

import fastavro
import pytest
from fastavro.validation import validate
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core import headers as H
from retrytopics.core.headers import DlqReason, Lineage, RetryHeaders, to_record
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.router import InboundRecord, RouteContext, route


def load(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(files("retrytopics.schemas").joinpath(name).read_text(encoding="utf-8"))
    return schema


RETRY = load("retry_headers.avsc")
DLQ = load("dlq_record.avsc")
PARSED_RETRY: Any = fastavro.parse_schema(RETRY)
PARSED_DLQ: Any = fastavro.parse_schema(DLQ)


def test_the_schemas_parse_and_the_dlq_schema_inlines_the_same_retry_headers() -> None:
    assert PARSED_RETRY["name"] == "retrytopics.RetryHeaders"
    retry_field = next(f for f in DLQ["fields"] if f["name"] == "retry")
    assert retry_field["type"] == RETRY


def test_every_field_is_a_documented_header_of_the_code() -> None:
    top = {f["name"]: f["header"] for f in RETRY["fields"] if f["name"] != "lineage"}
    lineage_type = next(f for f in RETRY["fields"] if f["name"] == "lineage")["type"]
    nested = {f["name"]: f["header"] for f in lineage_type["fields"]}
    assert set(top) | {"lineage"} == {f.name for f in dataclasses.fields(RetryHeaders)}
    assert set(nested) == {f.name for f in dataclasses.fields(Lineage)}
    constants = {v for k, v in vars(H).items() if k.isupper() and isinstance(v, str) and v.startswith("retry.")}
    assert set(top.values()) | set(nested.values()) == constants - {H.RETRY_PREFIX}
    reasons = next(f for f in RETRY["fields"] if f["name"] == "dlq_reason")["type"][1]["symbols"]
    assert reasons == [r.value for r in DlqReason]
    assert all(f.get("doc") for f in [*RETRY["fields"], *lineage_type["fields"]])


def routed(failure: BaseException, *, replayed: bool) -> RetryHeaders:
    policy = RetryPolicy(max_retries=0 if isinstance(failure, ValueError) else None)
    ctx = RouteContext(policy=policy, topics=topics_for("orders", "billing", policy.tier_delays_ms), group="billing")
    lineage = ((H.REPLAY_ID, b"run-1"), (H.REPLAYED_AT, b"5"), (H.REPLAY_COUNT, b"1")) if replayed else ()
    record = InboundRecord(topic="orders", partition=0, offset=1, timestamp_ms=-1, key=None, headers=lineage)
    return route(ctx, record, failure, now_ms=1_700_000_000_000, rng=random.Random(0)).retry


@pytest.mark.parametrize(("failure", "replayed"), [(OSError("x"), False), (ValueError("é" * 900), True)])
def test_real_retry_headers_validate_and_round_trip_through_avro(failure: BaseException, replayed: bool) -> None:
    h = routed(failure, replayed=replayed)
    record = to_record(h)
    assert validate(record, PARSED_RETRY, raise_errors=True)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, PARSED_RETRY, record)
    buffer.seek(0)
    assert fastavro.schemaless_reader(buffer, PARSED_RETRY) == record


def test_a_dlq_record_validates() -> None:
    h = routed(ValueError("bad"), replayed=False)
    assert h.dlq_reason is DlqReason.EXHAUSTED
    dlq = {
        "key": None,
        "value": b"\x00\x01payload",
        "headers": [{"key": "trace", "value": b"\xff"}, {"key": "empty", "value": None}],
        "retry": to_record(h),
    }
    assert validate(dlq, PARSED_DLQ, raise_errors=True)


def test_an_invalid_record_does_not_validate() -> None:
    record = to_record(routed(OSError(), replayed=False))
    record["dlq_reason"] = "bored"
    assert not validate(record, PARSED_RETRY, raise_errors=False)


@given(st.integers(min_value=1, max_value=2**31 - 1), st.integers(min_value=0, max_value=2**63 - 1))
def test_int_ranges_of_the_code_fit_the_avro_types(reconsume: int, offset: int) -> None:
    h = dataclasses.replace(routed(OSError(), replayed=False), reconsume_times=reconsume, original_offset=offset)
    assert validate(to_record(h), PARSED_RETRY, raise_errors=True)


FOLLOWER = load("follower_headers.avsc")


def test_the_follower_schema_is_exactly_the_headers_the_core_writes_and_a_follower_validates() -> None:
    """schemas/follower_headers.avsc has one field per header `encode_follower` writes (its `header` names
    them), named like the `Follower` fields, each documented; a real follower's headers, decoded, validate."""
    from retrytopics.core.keyorder.follower import Follower, encode_follower

    follower = Follower(
        original_topic="orders",
        original_partition=3,
        original_offset=2**63 - 1,
        original_timestamp=-1,
        consumer_group="billing",
        origin_message_id="orders-3-9",
        after=41,
        held_at=1_700_000_000_000,
    )
    headers = encode_follower(follower)
    assert [f["header"] for f in FOLLOWER["fields"]] == [name for name, _ in headers]
    assert {f["name"] for f in FOLLOWER["fields"]} == {f.name for f in dataclasses.fields(Follower)} | {
        "schema_version"
    }
    assert all(f.get("doc") for f in FOLLOWER["fields"])
    record = {**dataclasses.asdict(follower), "schema_version": 1}
    assert validate(record, fastavro.parse_schema(FOLLOWER), raise_errors=True)
