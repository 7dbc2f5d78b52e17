"""Guarantees of the CLI as operators run it (subprocesses on a real broker):

- `retrytopics demo --json` reports numbers that equal what an independent reader finds on the topics, and
  what the seeded fates imply; nothing is lost and no handler call happens before its due time;
- `retrytopics run MODULE:OBJECT` drains on SIGTERM and commits exactly what it handled (committed offset ==
  last handled offset + 1 on every partition, no gap), and its metrics endpoint shows real counters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from retrytopics.connectors.admin import TopicSpec, committed_offsets, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.embedded import free_port
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer
from retrytopics.core.headers import decode
from retrytopics.operator.demo import Fate, assign_fates

pytestmark = pytest.mark.broker
CLI = str(Path(sys.executable).with_name("retrytopics"))


def _read_all(
    kafka: KafkaConfig, topic: str, partitions: int, expected: int | None = None, idle_s: float = 2.0
) -> list:
    """Every record of `topic`, read from offset 0 until `expected` records or `idle_s` without any."""
    consumer = make_consumer(kafka, group_id=None)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, last = [], time.monotonic()
    while time.monotonic() - last < idle_s and (expected is None or len(records) < expected):
        for message in consumer.consume(1000, 0.2):
            if message.error() is None:
                records.append(message)
                last = time.monotonic()
    consumer.close()
    return records


def test_demo_json_equals_what_the_topics_hold(kafka: KafkaConfig) -> None:
    records, seed = 2000, 11
    result = subprocess.run(
        [
            CLI,
            "demo",
            "--json",
            "--no-spark",
            "--records",
            str(records),
            "--seed",
            str(seed),
            "--bootstrap",
            kafka.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    topics = summary["topics"]

    dlq = [decode(list(m.headers())) for m in _read_all(kafka, topics["dlq"], 3)]
    dlq_ids = [h.origin_message_id for h in dlq]
    assert len(dlq_ids) == len(set(dlq_ids)), "an order was dead-lettered twice"
    assert summary["dead_lettered"] == dict(sorted(Counter(h.dlq_reason.value for h in dlq).items()))
    first_tier = _read_all(kafka, topics["tiers"][0], 3)

    fates = Counter(assign_fates(records, seed))
    assert summary["records"] == records and summary["lost"] == 0 and summary["early_calls"] == 0
    assert summary["succeeded_first_try"] == fates[Fate.OK]
    assert summary["succeeded_after_retry"] == fates[Fate.FAIL_ONCE] + fates[Fate.FAIL_TWICE]
    assert summary["dead_lettered"] == {
        reason: count
        for reason, count in (
            ("exhausted", fates[Fate.ALWAYS]),
            ("non_retryable", fates[Fate.NON_RETRYABLE]),
            ("poison", fates[Fate.POISON]),
        )
        if count
    }
    assert len(first_tier) == fates[Fate.FAIL_ONCE] + fates[Fate.FAIL_TWICE] + fates[Fate.ALWAYS]
    assert summary["both_succeeded_and_dead_lettered"] == 0
    exhausted = [h for h in dlq if h.dlq_reason.value == "exhausted"]
    assert {h.reconsume_times for h in exhausted} == {len(topics["tiers"]) + 1}


APP_MODULE = textwrap.dedent(
    """
    import os, time
    from retrytopics import KafkaConfig, RetryApp, RetryPolicy

    app = RetryApp(
        kafka=KafkaConfig(bootstrap=os.environ["RT_BOOTSTRAP"]), group=os.environ["RT_GROUP"],
        # statistics every 500 ms instead of 15 s, so that the lag gauge is set before the scrape
        consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "statistics.interval.ms": 500},
        commit_interval="200ms",
    )
    log = open(os.environ["RT_LOG"], "a", buffering=1)

    @app.handler(os.environ["RT_TOPIC"], policy=RetryPolicy(delays=["1s"]))
    def handle(record):
        time.sleep(0.002)  # slow enough that SIGTERM lands mid-stream
        log.write(f"{record.partition} {record.offset}\\n")
    """
)


def test_run_drains_on_sigterm_commits_what_it_handled_and_serves_metrics(
    kafka: KafkaConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    topic, group = unique_name("cli-run"), unique_name("cli-group")
    ensure_topics(make_admin(kafka), [TopicSpec(name=topic, partitions=2)])
    producer = make_producer(kafka)
    for i in range(3000):
        producer.produce(topic, key=str(i).encode(), value=b"v")
    assert producer.flush(30) == 0
    (tmp_path / "cli_app.py").write_text(APP_MODULE)
    log, port = tmp_path / "handled.log", free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "RT_BOOTSTRAP": kafka.bootstrap,
        "RT_GROUP": group,
        "RT_TOPIC": topic,
        "RT_LOG": str(log),
    }
    process = subprocess.Popen(
        [CLI, "run", "cli_app:app", "--metrics-port", str(port)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120  # a bound: a busy machine may take a minute to start the CLI
        while (not log.exists() or len(log.read_text().splitlines()) < 1200) and time.monotonic() < deadline:
            time.sleep(0.1)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            process.kill()

    handled = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    assert 1200 <= len(handled) < 3000, "SIGTERM should land mid-stream"
    assert len(handled) == len(set(handled)), "a clean stop handles nothing twice"
    committed = committed_offsets(kafka, group, topic, 2)
    for partition in (0, 1):
        offsets = sorted(o for p, o in handled if p == partition)
        assert offsets == list(range(len(offsets))), "handled offsets have a gap"
        assert (committed[partition] or 0) == len(offsets), f"partition {partition}: committed != handled"
    scraped = [line for line in body.splitlines() if line.startswith("retrytopics_records_handled_total{")]
    assert scraped and float(scraped[0].rsplit(" ", 1)[1]) > 0
    assert "retrytopics_healthy 1.0" in body.splitlines()
    assert any(line.startswith(f'retrytopics_consumer_lag{{topic="{topic}"}} ') for line in body.splitlines()), body


DEAD_BROKER_APP = textwrap.dedent(
    """
    import os
    from retrytopics import KafkaConfig, RetryApp, RetryPolicy

    app = RetryApp(kafka=KafkaConfig(bootstrap=os.environ["RT_BOOTSTRAP"]), group="billing")

    @app.handler("orders", policy=RetryPolicy(delays=["1s"]))
    def handle(record):
        pass
    """
)


def test_metrics_answer_and_the_outage_is_logged_once_while_no_broker_answers(tmp_path: Path) -> None:
    """With every broker unreachable, `/metrics` still answers (health and counters come from memory, never
    from a broker request), and the outage is one WARNING line, its repeated reconnect failures DEBUG."""
    (tmp_path / "dead_app.py").write_text(DEAD_BROKER_APP)
    port = free_port()
    env = {**os.environ, "RT_BOOTSTRAP": f"127.0.0.1:{free_port()}"}  # nothing listens there
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    process = subprocess.Popen(
        [CLI, "run", "dead_app:app", "--metrics-port", str(port), "--log-level", "DEBUG"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()

    def refused(level: str) -> list[str]:
        return [
            line
            for line in list(lines)
            if line.split()[2:4] == [level, "retrytopics.kafka:"] and "Connection refused" in line
        ]

    try:
        body, deadline = "", time.monotonic() + 30
        while (len(refused("DEBUG")) < 3 or "retrytopics_healthy" not in body) and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(0.1)  # the endpoint is not up yet
            time.sleep(0.05)
        assert "retrytopics_healthy 1.0" in body.splitlines(), body[-2000:]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    assert len(refused("DEBUG")) >= 3, "librdkafka kept reconnecting"
    assert len(refused("WARNING")) == 1, "".join(lines)[-3000:]
