"""Republishes whose outcome the producer cannot know (the fault tests' own broker, behind this test's TCP
proxy on loopback).

Three toxics hit the ProduceRequest carrying a failed record's republish to its tier: the response is lost
after the broker wrote the record; the connection is reset after the whole request was forwarded; the
connection is reset mid-request. librdkafka retries the request in place (same producer id and sequence
numbers), and the broker recognises the retry of a written batch as a duplicate.

Guarantees: with the idempotent producer (the product default), each (origin, attempt) is in the tier exactly
once, no delivery error reaches the app (no producer replacement, nothing for the duplicate audit to do), and
every record completes. A negative control, a producer without idempotence under the first two toxics,
writes the record twice, so the toxics do create the ambiguity.

A lost response is retried when the request times out, after `socket.timeout.ms`, which must stay below
`message.timeout.ms` (as librdkafka's defaults, 60 s and 300 s, do); otherwise the record times out with
`_MSG_TIMED_OUT`, the runtime replaces the producer and sends it again, and the tier's duplicate audit has to
absorb the second copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import decode

from .conftest import Kit, wait_until
from .proxy import PRODUCE, KafkaProxy

pytestmark = pytest.mark.broker

#: A lost produce response times out (and the request is retried) after 1.5 s instead of librdkafka's 60 s.
PRODUCER = {"socket.timeout.ms": 1500}
CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
TOXICS: dict[bytes, Callable[[KafkaProxy], None]] = {
    b"response-lost": lambda proxy: proxy.drop_responses(PRODUCE, times=1),
    b"reset-after-request": lambda proxy: proxy.cut_after_bytes(PRODUCE, 1 << 30, times=1),
    b"reset-mid-request": lambda proxy: proxy.cut_after_bytes(PRODUCE, 40, times=1),
}


def test_an_ambiguous_republish_is_written_once(
    proxied: tuple[KafkaConfig, KafkaProxy], unique_name: Callable[[str], str]
) -> None:
    kafka, proxy = proxied
    kit = Kit(kafka)
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=CONSUMER, producer_overrides=PRODUCER)
    lock = threading.Lock()
    calls: list[tuple[bytes, int]] = []

    @app.handler(source, policy=RetryPolicy(delays=["100ms"]))
    def handle(record: Record[bytes]) -> None:
        with lock:
            calls.append((record.value, record.attempt))
        if record.attempt == 1:
            TOXICS[record.value](proxy)  # the next produce request through the proxy is this record's republish
            raise RuntimeError("fails once")

    app.provision()
    tier = app.topics(source).tiers[0].topic
    app.start(main=True, tiers="all")
    try:
        # when: one record at a time, so that each toxic hits exactly its own republish
        for value in TOXICS:
            kit.produce(source, [(None, value, [])])
            wait_until(lambda value=value: (value, 2) in calls, 30, f"{value!r} to be retried from the tier")
        wait_until(lambda: kit.committed(group, source, 1) == {0: len(TOXICS)}, 10, "every offset committed")
    finally:
        assert app.stop()

    # then: every toxic hit a republish, and librdkafka absorbed it
    assert proxy.responses_dropped[PRODUCE] == 1 and proxy.cuts[PRODUCE] == 2
    assert app.stats.publish_failures == 0 and app.stats.duplicates_suppressed == 0
    # then: each (origin, attempt) is in the tier exactly once; each record was retried once
    hops = sorted(
        (r.value, decode(list(r.headers)).origin_message_id, decode(list(r.headers)).reconsume_times)
        for r in kit.read_all(tier)
    )
    offsets = {value: i for i, value in enumerate(TOXICS)}
    assert hops == sorted((value, f"{source}-0-{offsets[value]}", 1) for value in TOXICS)
    assert sorted(calls) == sorted([(v, 1) for v in TOXICS] + [(v, 2) for v in TOXICS])

    # negative control: without idempotence, the same toxics write the record twice
    control = kit.create(unique_name("control"), 1)
    plain = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "enable.idempotence": False,
            "acks": "all",
            "batch.num.messages": 1,
            **PRODUCER,
        }
    )
    for value in (b"response-lost", b"reset-after-request"):
        TOXICS[value](proxy)
        plain.produce(control, value)
        assert plain.flush(30) == 0
    assert sorted(r.value for r in kit.read_all(control)) == [b"reset-after-request"] * 2 + [b"response-lost"] * 2
