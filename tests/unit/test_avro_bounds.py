"""Hostile Avro values are poison in milliseconds, never a hang, a memory blow-up or a crash.

Before the bounds, a 10-byte `array<null>` value decoded for ever (about 200 MB/s of Nones) and a recursive
schema nested 10,000 deep crashed the interpreter (segmentation fault in fastavro's C reader), so the hostile
cases run in a child process with a deadline: a hang or a crash fails the test instead of the test run.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.connectors.serde import avro, avro_serializer, deserialize
from retrytopics.core.errors import ConfigError, PoisonRecordError

#: zigzag varints: 2⁶³ - 1 and -2³¹ (a negative block count is followed by the block's byte size)
HUGE = "fe" + "ff" * 7 + "ff01"
NEGATIVE = "fdffffff0f"
LINKED = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
TREE = {
    "type": "record",
    "name": "Tree",
    "fields": [
        {"name": "label", "type": "string"},
        {"name": "children", "type": {"type": "array", "items": "Tree"}},
        {"name": "tags", "type": {"type": "map", "values": "null"}},
    ],
}
ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount_cents", "type": "long"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [
                        {"name": "sku", "type": "string"},
                        {"name": "qty", "type": "int"},
                        {"name": "price", "type": "double"},
                    ],
                },
            },
        },
        {"name": "attributes", "type": {"type": "map", "values": ["null", "string", "long"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    ],
}

# name: (writer schema, value as hex)
HOSTILE: dict[str, tuple[Any, str]] = {
    "array<null>, one huge block": ({"type": "array", "items": "null"}, HUGE),
    "array<null>, negative count": ({"type": "array", "items": "null"}, NEGATIVE + "00"),
    "array<array<null>>": ({"type": "array", "items": {"type": "array", "items": "null"}}, "02" + HUGE),
    "map of array<null>": ({"type": "map", "values": {"type": "array", "items": "null"}}, "0200" + HUGE),
    "array of empty records": ({"type": "array", "items": {"type": "record", "name": "E", "fields": []}}, HUGE),
    "array of fixed(0)": ({"type": "array", "items": {"type": "fixed", "name": "Z", "size": 0}}, HUGE),
    "record of nulls in an array": (
        {"type": "array", "items": {"type": "record", "name": "R", "fields": [{"name": "a", "type": "null"}]}},
        HUGE,
    ),
    "linked list 10,000 deep": (LINKED, "02" * 10_000 + "00"),
    "tree 10,000 deep": (TREE, "0002" * 10_000),
    "array<int>, huge count": ({"type": "array", "items": "int"}, HUGE),
    "map<null>, huge count": ({"type": "map", "values": "null"}, HUGE),
    "string, huge length": ('"string"', HUGE),
    "bytes, negative length": ('"bytes"', "01"),
}

CHILD_MEMORY_BYTES = 2 * 1024**3
_CHILD = """
import json, sys, time
from retrytopics.connectors.serde import avro, deserialize
from retrytopics.core.errors import PoisonRecordError
for name, (schema, value) in json.loads(sys.stdin.read()).items():
    decode = avro(schema)
    started = time.perf_counter()
    try:
        deserialize(decode, bytes.fromhex(value), topic="t", partition=0, offset=0)
        outcome = "decoded"
    except PoisonRecordError as exc:
        outcome = "poison: " + str(exc)[:200]
    print(json.dumps([name, outcome, time.perf_counter() - started]), flush=True)
"""


def _limit_memory() -> None:
    # without the bounds, `array<null>` grows ~200 MB/s: cap the child instead of the shared machine
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))


def test_hostile_values_are_poison_in_milliseconds() -> None:
    # when: every hostile value is decoded in a child process, which must finish (no hang, no crash)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps(HOSTILE),
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=_limit_memory,
    )
    # then
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    results = {name: (outcome, seconds) for name, outcome, seconds in map(json.loads, child.stdout.splitlines())}
    assert set(results) == set(HOSTILE)
    for name, (outcome, seconds) in results.items():
        assert outcome.startswith("poison: "), (name, outcome)
        assert seconds < 1.0, (name, seconds)  # measured: under 1 ms each


def test_bounded_schemas_keep_decoding_legitimate_values() -> None:
    nulls = avro({"type": "array", "items": "null"}, max_items=3)
    assert nulls(bytes.fromhex("0600")) == [None, None, None]
    with pytest.raises(ValueError, match="more than 3 items"):
        nulls(bytes.fromhex("0800"))
    linked = avro(LINKED, max_depth=100)
    value: dict[str, Any] = {"next": None}
    for _ in range(99):  # 100 records deep
        value = {"next": value}
    assert linked(avro_serializer(LINKED)(value)) == value
    with pytest.raises(ValueError, match="nested deeper than 100"):
        linked(bytes.fromhex("02" * 100 + "00"))  # 101 records deep


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_limits_must_be_positive_ints(limit: object) -> None:
    with pytest.raises(ConfigError) as info:
        avro(LINKED, max_depth=limit)  # type: ignore[arg-type]
    assert info.value.field == "max_depth"


def _decodes_or_is_poison(decode: Any, data: bytes) -> None:
    started = time.perf_counter()
    try:
        deserialize(decode, data, topic="t", partition=0, offset=0)
    except PoisonRecordError:
        pass
    assert time.perf_counter() - started < 1.0


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=256))
def test_random_bytes_for_a_real_schema_decode_or_are_poison(data: bytes) -> None:
    _decodes_or_is_poison(avro(ORDER), data)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=256))
def test_random_bytes_for_a_recursive_schema_decode_or_are_poison(data: bytes) -> None:
    _decodes_or_is_poison(avro(TREE), data)


@settings(max_examples=100, deadline=None)
@given(depth=st.integers(0, 60), flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
def test_mutated_valid_trees_decode_or_are_poison(depth: int, flips: list[tuple[int, int]]) -> None:
    tree: dict[str, Any] = {"label": "leaf", "children": [], "tags": {}}
    for level in range(depth):
        tree = {"label": f"n{level}", "children": [tree], "tags": {"x": None}}
    data = bytearray(avro_serializer(TREE)(tree) or b"")
    if not flips:
        assert avro(TREE)(bytes(data)) == tree
    for position, byte in flips:
        data[position % len(data)] = byte
    _decodes_or_is_poison(avro(TREE), bytes(data))
