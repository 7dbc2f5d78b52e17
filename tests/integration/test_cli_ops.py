"""Guarantees of the operator commands, run as a user runs them (a subprocess): `topics create` is
idempotent and names what it did; `dlq peek` shows decoded retry headers; bad settings exit 2 with the
field named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from retrytopics.connectors.admin import TopicSpec, ensure_topics, partition_count
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.core.headers import DlqReason, RetryHeaders, encode

pytestmark = pytest.mark.broker
CLI = str(Path(sys.executable).with_name("retrytopics"))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, env=env)


def test_topics_create_is_idempotent(kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
    source, group = unique_name("orders"), "billing"
    ensure_topics(make_admin(kafka), [TopicSpec(name=source, partitions=2)])
    args = [
        "topics",
        "create",
        "--bootstrap",
        kafka.bootstrap,
        "--topic",
        source,
        "--group",
        group,
        "--delays",
        "1s,250ms",
    ]
    first, second = _cli(*args), _cli(*args)
    assert first.returncode == 0, first.stderr
    expected = [f"{source}.{group}.retry.250ms", f"{source}.{group}.retry.1s", f"{source}.{group}.dlq"]
    assert first.stdout.split() == [word for topic in expected for word in ("created", topic)]
    assert second.stdout.split() == [word for topic in expected for word in ("exists", topic)]
    admin = make_admin(kafka)
    assert [partition_count(admin, t) for t in expected] == [2, 2, 2]  # as many as the source


def test_dlq_peek_decodes_retry_headers(kafka: KafkaConfig, unique_name: Callable[[str], str]) -> None:
    dlq = unique_name("peek-dlq")
    ensure_topics(make_admin(kafka), [TopicSpec(name=dlq, partitions=1)])
    retry = RetryHeaders(
        reconsume_times=3,
        origin_message_id="order-42",
        original_topic="orders",
        original_partition=0,
        original_offset=42,
        original_timestamp=1_700_000_000_000,
        consumer_group="billing",
        tier=None,
        due_at=None,
        first_failed_at=1_700_000_000_100,
        last_failed_at=1_700_000_009_000,
        exception_type="builtins.TimeoutError",
        exception_message="gateway timed out",
        exception_trace="...",
        dlq_reason=DlqReason.EXHAUSTED,
    )
    producer = make_producer(kafka)
    producer.produce(dlq, key=b"k-42", value=b"\x00\x01binary", headers=[("trace-id", b"abc"), *encode(retry)])
    producer.produce(dlq, key=b"k-43", value=b"x", headers=[("retry.reconsume_times", b"-1")])
    assert producer.flush(10) == 0

    result = _cli("dlq", "peek", "--bootstrap", kafka.bootstrap, "--dlq-topic", dlq, "--json")
    assert result.returncode == 0, result.stderr
    good, bad = [json.loads(line) for line in result.stdout.splitlines()]
    assert good["retry"]["reason"] == "exhausted" and good["retry"]["origin_message_id"] == "order-42"
    assert good["retry"]["reconsume_times"] == 3 and good["retry"]["original"] == "orders[0]@42"
    assert good["key"] == "k-42" and good["value"].startswith("base64:")
    assert good["user_headers"] == {"trace-id": "abc"}
    assert bad["retry"] is None and "retry." in bad["header_error"]


def test_a_reader_that_goes_away_ends_the_command_quietly(
    kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """`retrytopics dlq peek --json | head -1`: the reader closes the pipe, the command exits 141 (as if
    killed by SIGPIPE) without a traceback."""
    dlq = unique_name("pipe-dlq")
    ensure_topics(make_admin(kafka), [TopicSpec(name=dlq, partitions=1)])
    producer = make_producer(kafka)
    for i in range(3):
        producer.produce(dlq, key=str(i).encode(), value=b"v")
    assert producer.flush(10) == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line: every write fails with EPIPE
    try:
        result = subprocess.run(
            [CLI, "dlq", "peek", "--bootstrap", kafka.bootstrap, "--dlq-topic", dlq, "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["topics", "create", "--topic", "t", "--group", "g"], "kafka.bootstrap"),
        (["topics", "create", "--bootstrap", "h:1", "--topic", "t", "--group", "g", "--delays", "5"], "app.delays[0]"),
        (["topics", "create", "--bootstrap", "nohost", "--topic", "t", "--group", "g"], "kafka.bootstrap"),
        (["topics", "create", "--bootstrap", "h:1", "--group", "g"], "app.topic"),
    ],
)
def test_bad_settings_exit_2_naming_the_field(args: list[str], field: str) -> None:
    result = _cli(*args, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert f"configuration error: {field}=" in result.stderr
