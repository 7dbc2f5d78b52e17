"""A record forged into the DLQ and the source records it names: the threat model as documented.

A principal with WRITE on the DLQ writes, before the main consumer is assigned its partition, a DLQ record
naming an unhandled source record (offset 4: its coordinates, timestamp, key and value, all of which READ on
the source shows). The seeded duplicate check (runtime/records/duplicates.py) reads the DLQ's tail at assignment.

Guarantees:
- with `header_key`, the forged record does not verify and seeds nothing: every source record, offset 4
  included, is handled, none suppressed;
- without it, the behaviour docs/operations.md states holds (WRITE on the DLQ is WRITE on the app's fate):
  offset 4 is taken for handed off and finished without a call, counted as a suppressed duplicate;
- `retrytopics topics create` says so on stderr, and says when no header_key is set.

An operator's offset reset is not a forgery but looks like one to the seeding: the group is sent back over
records whose hops are downstream. Every record from the reset on is handled again, none suppressed
(core/commit_marks.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_producer
from retrytopics.core.headers import DlqReason, RetryHeaders, encode

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

KEY = "k" * 32
T0 = 1_700_000_000_000
RECORDS = 6
CLI = str(Path(sys.executable).with_name("retrytopics"))


def _forged_dlq_record(source: str, group: str, offset: int) -> list[tuple[str, bytes | None]]:
    state = RetryHeaders(
        reconsume_times=1,
        origin_message_id=f"{source}-0-{offset}",
        original_topic=source,
        original_partition=0,
        original_offset=offset,
        original_timestamp=T0 + offset,
        consumer_group=group,
        tier=None,
        due_at=None,
        first_failed_at=T0,
        last_failed_at=T0,
        exception_type="x.Forged",
        exception_message="forged",
        exception_trace="",
        dlq_reason=DlqReason.NON_RETRYABLE,
    )
    return list(encode(state))


@pytest.mark.parametrize("keyed", [True, False], ids=["header_key", "no_key"])
def test_a_forged_dlq_record_and_the_source_record_it_names(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    keyed: bool,
) -> None:
    # setup: six source records with known timestamps, and a forged DLQ record naming offset 4
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides, header_key=KEY if keyed else None)
    apps.append(app)
    handled: list[int] = []
    lock = threading.Lock()

    @app.handler(source, policy=RetryPolicy(delays=["1s"]))
    def handle(record: Record[bytes]) -> None:
        with lock:
            handled.append(record.offset)

    app.provision()
    producer = make_producer(kafka)
    for i in range(RECORDS):
        producer.produce(source, key=None, value=f"v{i}".encode(), timestamp=T0 + i)
    assert producer.flush(30) == 0
    kit.produce(app.topics(source).dlq, [(None, b"v4", _forged_dlq_record(source, group, 4))])

    # when
    app.start(main=True)
    wait_until(lambda: kit.committed(group, source, 1) == {0: RECORDS}, 60, "every source offset committed")
    assert app.stop()

    # then
    if keyed:  # the forged record seeds nothing: offset 4 is handled like the others
        assert sorted(handled) == list(range(RECORDS))
        assert app.stats.duplicates_suppressed == 0
    else:  # the documented behaviour without a key: offset 4 is taken for handed off, never handled
        assert sorted(handled) == [0, 1, 2, 3, 5]
        assert app.stats.duplicates_suppressed == 1


def test_after_an_operator_resets_the_group_every_record_is_handled_again_none_suppressed(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
) -> None:
    # setup: six source records; the first run fails the odd offsets (hops to the tier) and commits them all
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    handled: list[tuple[int, int]] = []
    lock = threading.Lock()

    def run(number: int) -> RetryApp:
        app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides)
        apps.append(app)

        @app.handler(source, policy=RetryPolicy(delays=["1h"]))
        def handle(record: Record[bytes]) -> None:
            with lock:
                handled.append((number, record.offset))
            if number == 1 and record.offset % 2:
                raise RuntimeError("the first run fails the odd offsets")

        app.provision()
        app.start(main=True)
        wait_until(lambda: kit.committed(group, source, 1) == {0: RECORDS}, 60, f"run {number} committed all")
        assert app.stop()
        return app

    kit.produce(source, [(None, f"v{i}".encode(), []) for i in range(RECORDS)])
    first = run(1)
    assert len(kit.read_all(first.topics(source).tiers[0].topic)) == RECORDS // 2

    # when: the operator sends the group back to the start, as kafka-consumer-groups --reset-offsets does
    admin = kit.admin
    reset = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, [TopicPartition(source, 0, 0)])])
    reset[group].result(30)
    second = run(2)

    # then: every record is handled again, the ones handed off before the reset too
    assert sorted(offset for number, offset in handled if number == 2) == list(range(RECORDS))
    assert second.stats.duplicates_suppressed == 0


def test_topics_create_says_who_may_write_the_tiers_and_the_dlq(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str]
) -> None:
    source = kit.create(unique_name("orders"), 1)
    args = [
        CLI,
        "topics",
        "create",
        "--bootstrap",
        kafka.bootstrap,
        "--topic",
        source,
        "--group",
        "billing",
        "--delays",
        "1s",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRYTOPICS_")}
    plain = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    keyed = subprocess.run(
        args, capture_output=True, text=True, timeout=60, env={**env, "RETRYTOPICS_APP_HEADER_KEY": KEY}
    )
    assert plain.returncode == keyed.returncode == 0, plain.stderr + keyed.stderr
    for result in (plain, keyed):
        assert "WRITE there is WRITE on the app's fate" in result.stderr
        assert "WRITE" not in result.stdout  # stdout still lists only the topics
    assert "No header_key is set" in plain.stderr and "No header_key is set" not in keyed.stderr
    assert KEY not in keyed.stderr + keyed.stdout
