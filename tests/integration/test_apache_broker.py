"""Guarantee: the project's Apache Kafka broker (KRaft, from the Maven cache) starts, answers metadata and
runs transactions, survives a crash with its log, and leaves no JVM or port behind; start-up failures come
with a clear error that says what to do."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Producer

from retrytopics.connectors import apache
from retrytopics.connectors.apache import ApacheKafkaBroker
from retrytopics.connectors.kafka import make_admin

from .processes import gone

pytestmark = pytest.mark.broker


def test_lifecycle_transactions_and_a_crash_restart_keep_the_log() -> None:
    broker = ApacheKafkaBroker().start()
    try:
        assert broker.pid is not None and broker.port is not None and broker.controller_port is not None
        ports = (broker.port, broker.controller_port)
        assert len(make_admin(broker.kafka_config()).list_topics(timeout=5).brokers) == 1

        # transactions work on a single node: internal topics have replication factor 1
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "lifecycle"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("kept", b"durable")
        producer.commit_transaction(30)

        # a SIGKILLed broker comes back on the same ports with its data
        first_pid = broker.pid
        broker.kill()
        assert gone(first_pid, *ports)
        broker.start()
        assert broker.port == ports[0]
        topics = make_admin(broker.kafka_config()).list_topics(timeout=10).topics
        assert "kept" in topics
        pid = broker.pid
        assert pid is not None
    finally:
        broker.stop()
    assert gone(pid, *ports)


def test_sigkill_of_the_owner_takes_the_broker_down() -> None:
    script = (
        "import time\nfrom retrytopics.connectors.apache import ApacheKafkaBroker\n"
        "b = ApacheKafkaBroker().start()\nprint(b.pid, b.port, flush=True)\ntime.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    pid, port = map(int, child.stdout.readline().split())
    child.kill()
    child.wait(timeout=5)
    assert gone(pid, port), "the broker JVM outlived its owner"


def test_a_bad_setting_fails_start_up_with_the_log_tail() -> None:
    broker = ApacheKafkaBroker(settings={"num.partitions": "not-a-number"}, startup_timeout_s=30)
    with pytest.raises(apache.BrokerExitedEarly) as info:
        broker.start()
    assert "num.partitions" in info.value.log_tail
    assert broker.pid is None


def test_without_java_17_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apache, "java_major_version", lambda java="java": 11)
    with pytest.raises(apache.BrokerBinaryMissing, match="Java 17"):
        ApacheKafkaBroker().start()
