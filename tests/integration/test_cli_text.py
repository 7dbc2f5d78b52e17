"""`dlq peek` and `topics describe` without `--json` print aligned tables, whatever the length of a topic
name: people read them at a terminal. Before: `topics describe` padded topics to 48 characters, so a longer
name pushed its row out of the columns, and `dlq peek` printed `origin=None reconsume=None None: None` for a
record whose retry headers did not decode."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.core.headers import DlqReason, RetryHeaders, encode

pytestmark = pytest.mark.broker
CLI = str(Path(sys.executable).with_name("retrytopics"))


def _cli(*args: str) -> str:
    done = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_aligned(block: str) -> None:
    """Every line has the header's cells (separated by two or more spaces), each column left- or
    right-aligned on every line."""
    lines = block.splitlines()
    spans = [[m.span() for m in re.finditer(r"\S+(?: \S+)*", line)] for line in lines]
    assert all(len(s) == len(spans[0]) for s in spans), f"ragged rows:\n{block}"
    for column in zip(*spans, strict=True):
        assert len({s for s, _ in column}) == 1 or len({e for _, e in column}) == 1, f"not aligned:\n{block}"


def test_topics_describe_is_a_table_even_with_long_topic_names(
    kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    source = unique_name("orders-with-a-name-longer-than-the-old-column")
    pipeline = ["--bootstrap", kafka.bootstrap, "--topic", source, "--group", "billing", "--delays", "1s,10s"]
    _cli("topics", "create", *pipeline, "--partitions", "2", "--create-source")

    text = _cli("topics", "describe", *pipeline)

    assert not re.search(r"\{'|\['|\bNone\b", text), text
    assert_aligned(text)
    lines = text.splitlines()
    assert lines[0].split() == [
        "topic",
        "kind",
        "partition",
        "end",
        "committed",
        "lag",
        "state",
        "replicas",
        "isr",
        "min_isr",
    ]
    assert [line.split()[:3] for line in lines[1:3]] == [[source, "source", "0"], [source, "source", "1"]]
    assert len(lines) == 1 + 4 * 2 and lines[-1].split()[1] == "dlq"


def test_dlq_peek_is_a_table_and_says_which_headers_were_bad(
    kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    dlq = unique_name("peek-text-dlq")
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
    producer.produce(dlq, key=b"k-42", value=b"v", headers=encode(retry))
    producer.produce(dlq, key=None, value=b"x", headers=[("retry.reconsume_times", b"-1")])
    assert producer.flush(10) == 0

    text = _cli("dlq", "peek", "--bootstrap", kafka.bootstrap, "--dlq-topic", dlq)

    assert not re.search(r"\{'|\['|(origin|reconsume)=|: None\b", text), text
    assert_aligned(text)
    header, good, bad = text.splitlines()
    assert header.split() == ["record", "reason", "failures", "origin", "id", "exception", "key"]
    assert re.fullmatch(rf"{dlq}\[0\]@0 +exhausted +3 +order-42 +builtins\.TimeoutError: gateway timed out +k-42", good)
    assert re.fullmatch(rf"{dlq}\[0\]@1 +bad headers +- +- +header retry\.\S+ \S.* +-", bad)


def _follow_lines(args: list[str], count: int, timeout_s: float = 90.0) -> list[bytes]:
    """The first `count` lines `dlq peek --follow` prints (it never ends by itself: stopped after them)."""
    import queue
    import threading

    process = subprocess.Popen([CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines: queue.Queue[bytes] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in iter(stdout.readline, b"")], daemon=True).start()
    got: list[bytes] = []
    try:
        while len(got) < count:
            got.append(lines.get(timeout=timeout_s))
    finally:
        process.terminate()
        process.wait(10)
    return got


def test_dlq_peek_never_prints_a_records_control_characters(
    kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """Origin ids (an `id_header` value), exception text and keys are written by whoever writes the source:
    `dlq peek` prints their ESC/BEL/line breaks escaped, as a table and with `--follow`, and a long origin
    id shortened, so a record cannot retitle, clear or rewrite the operator's terminal."""
    dlq = unique_name("peek-escape-dlq")
    ensure_topics(make_admin(kafka), [TopicSpec(name=dlq, partitions=1)])
    hostile = "\x1b]0;owned\x07\x1b[2J\r"
    retry = RetryHeaders(
        reconsume_times=1,
        origin_message_id=hostile + "\x1b" * 480,
        original_topic="orders",
        original_partition=0,
        original_offset=7,
        original_timestamp=1_700_000_000_000,
        consumer_group="billing",
        tier=None,
        due_at=None,
        first_failed_at=1_700_000_000_100,
        last_failed_at=1_700_000_000_100,
        exception_type="Err" + hostile,
        exception_message="boom" + hostile,
        exception_trace="...",
        dlq_reason=DlqReason.NON_RETRYABLE,
    )
    producer = make_producer(kafka)
    producer.produce(dlq, key=b"k\x1b[2J", value=b"v", headers=encode(retry))
    assert producer.flush(10) == 0
    peek = ["dlq", "peek", "--bootstrap", kafka.bootstrap, "--dlq-topic", dlq]

    for text in (_cli(*peek).encode(), b"".join(_follow_lines([*peek, "--follow"], 2))):
        assert not [b for b in text if (b < 0x20 and b != 0x0A) or b == 0x7F], text
        assert text.count(b"\n") == 2, text
        row = text.decode().splitlines()[1]
        assert "\\x1b]0;owned\\x07\\x1b[2J\\r" in row and len(row) < 250, row
