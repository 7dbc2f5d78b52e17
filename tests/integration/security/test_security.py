"""TLS, SASL/SCRAM and ACLs on a real path, on the package's Apache Kafka broker: a SASL_SSL
listener (SCRAM-SHA-512, a certificate from a CA made by the tests, PEM) and the standard authorizer, with the
principals and ACLs docs/operations.md recommends (see conftest.py).

Guarantees: the app runs end to end under exactly those ACLs, configured only through `KafkaConfig` fields;
a wrong CA or a wrong password fails at start-up with an error that names the cause and what to check, and no
password (nor the key's) appears in any log line at DEBUG; an upstream producer cannot write a tier or the
DLQ (TOPIC_AUTHORIZATION_FAILED), nor can the replay principal write a tier.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from retrytopics import NonRetryable, Record, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import last_client_error, make_producer
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import DlqReason, decode
from retrytopics.operator.preflight import connection_hint

from ..runtime.conftest import Kit, wait_until
from .conftest import Secured, pipeline

pytestmark = pytest.mark.broker

POLICY = RetryPolicy(delays=["200ms", "400ms"], non_retryable=(ValueError,))


def _produce(kafka: KafkaConfig, topic: str, values: list[bytes]) -> list[KafkaError | None]:
    """Each record's delivery outcome (None: acknowledged)."""
    producer = make_producer(kafka)
    outcomes: list[KafkaError | None] = []
    for value in values:
        producer.produce(topic, value=value, key=value, on_delivery=lambda err, _msg: outcomes.append(err))
    assert producer.flush(30) == 0
    return outcomes


def _assert_no_secret(
    secured: Secured, caplog: pytest.LogCaptureFixture, *texts: str | None, also: tuple[str, ...] = ()
) -> None:
    lines = [record.getMessage() for record in caplog.records] + [t for t in texts if t]
    assert len(caplog.records) > 10, "too little was logged for the check to prove anything"
    for secret in (*secured.secrets, *also):
        assert not [line for line in lines if secret in line], "a secret reached a log line or an error"


def test_the_app_runs_end_to_end_over_sasl_ssl_under_least_privilege_acls(
    secured: Secured, unique_name: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    # setup: 2 partitions, 24 records: "ok" succeed, "flaky" fail once, "broken" always, "bad" is non-retryable
    caplog.set_level(logging.DEBUG)
    calls: Counter[bytes] = Counter()
    lock = threading.Lock()

    def handle(record: Record[bytes]) -> None:
        assert record.value is not None
        with lock:
            calls[record.value] += 1
        kind = record.value.split(b"-")[0]
        if kind == b"bad":
            raise NonRetryable(ValueError("bad record"))
        if kind == b"broken" or (kind == b"flaky" and record.attempt == 1):
            raise RuntimeError(f"failed on attempt {record.attempt}")

    app, source = pipeline(secured, unique_name, secured.kafka("billing"), POLICY, handle)
    values = [f"{kind}-{i}".encode() for kind in ("ok", "flaky", "broken", "bad") for i in range(6)]
    assert _produce(secured.kafka("upstream"), source, values) == [None] * len(values)

    # when: the main consumer and both tier consumers run as `billing`
    app.start(main=True, tiers="all")
    kit = Kit(secured.broker.kafka_config())
    topics = app.topics(source)
    try:
        dlq = wait_until(lambda: (r := kit.read_all(topics.dlq)) and len(r) == 12 and r, 60, "12 DLQ records")
        wait_until(lambda: sum(kit.committed(app.group, source, 2).values()) == 24, 30, "the source committed")
        healthy = app.healthy
    finally:
        assert app.stop(timeout=30)

    # then: every record ended where its plan says, and no ACL was missing on the way
    reasons = {r.value: decode(list(r.headers)).dlq_reason for r in dlq}
    assert reasons == {
        **{f"broken-{i}".encode(): DlqReason.EXHAUSTED for i in range(6)},
        **{f"bad-{i}".encode(): DlqReason.NON_RETRYABLE for i in range(6)},
    }
    assert calls == {
        **{f"ok-{i}".encode(): 1 for i in range(6)},
        **{f"flaky-{i}".encode(): 2 for i in range(6)},
        **{f"broken-{i}".encode(): 3 for i in range(6)},
        **{f"bad-{i}".encode(): 1 for i in range(6)},
    }
    assert healthy and app.error is None
    assert not [r for r in caplog.records if "AUTHORIZATION" in r.getMessage().upper() and r.levelno >= logging.WARNING]
    _assert_no_secret(secured, caplog)


@pytest.mark.parametrize("wrong", ["password", "ca"])
def test_a_wrong_password_or_ca_fails_at_start_up_with_a_clear_error_and_no_secret_logged(
    secured: Secured, unique_name: Callable[[str], str], caplog: pytest.LogCaptureFixture, wrong: str
) -> None:
    # setup: the framework's principal with a wrong password, or trusting an unrelated CA; librdkafka's own
    # security and broker debug lines flow into the captured logs too
    caplog.set_level(logging.DEBUG)
    fields = (
        {"sasl_password": secrets.token_urlsafe(18)}
        if wrong == "password"
        else {"ssl_ca_location": str(secured.pki.other_ca)}
    )
    kafka = secured.kafka("billing", **fields).with_overrides({"debug": "security,broker"})
    app, _source = pipeline(secured, unique_name, kafka, POLICY)

    # when: the app's first contact with the cluster
    with pytest.raises(KafkaClientError) as failure:
        app.provision(timeout="3s")
    # the client's error callback logs why once librdkafka has reported it, which may come a moment after
    # the request failed: polled (last_client_error serves it) until it has, within a deadline
    expected = (
        ("refused the credentials", "kafka.sasl_password")
        if wrong == "password"
        else ("certificate verify failed", "kafka.ssl_ca_location")
    )

    def warnings() -> list[str]:
        return [
            r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "retrytopics.kafka"
        ]

    def warned() -> bool:
        last_client_error()
        return any(all(part in w for part in expected) for w in warnings())

    wait_until(warned, 10, "the client's error callback to log why the connection failed")
    # this cluster's error: a client of another test's stopped broker may report meanwhile in this process
    message, hint = str(failure.value), connection_hint(failure.value.code, last_client_error(kafka))
    del failure
    gc.collect()  # the failed admin client goes, so that no later test reads its background error

    # then: the error says why, the CLI's hint and the log what to check; no password or key password anywhere
    if wrong == "password":
        assert "Authentication failed" in message and "SCRAM-SHA-512" in message
        assert hint is not None and "kafka.sasl_password" in hint
    else:
        assert "certificate verify failed" in message
        assert hint is not None and "kafka.ssl_ca_location" in hint
    assert [w for w in warnings() if all(part in w for part in expected)]
    assert [r for r in caplog.records if r.name == "retrytopics.librdkafka"], (
        "librdkafka's debug lines were checked too"
    )
    _assert_no_secret(secured, caplog, message, hint, also=tuple(fields.values()) if wrong == "password" else ())


def test_the_cli_with_a_wrong_password_file_exits_with_a_hint_and_prints_no_secret(
    secured: Secured, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    # setup: an operator's settings, the password in a file (never argv), DEBUG logging on stderr
    _app, source = pipeline(secured, unique_name, secured.kafka("billing"), POLICY)
    wrong = secrets.token_urlsafe(18)
    password_file = tmp_path / "kafka-password"
    password_file.write_text(wrong)
    env = {
        **os.environ,
        "RETRYTOPICS_KAFKA_BOOTSTRAP": secured.broker.bootstrap,
        "RETRYTOPICS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "RETRYTOPICS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "RETRYTOPICS_KAFKA_SASL_USERNAME": "billing",
        "RETRYTOPICS_KAFKA_SASL_PASSWORD_FILE": str(password_file),
        "RETRYTOPICS_KAFKA_SSL_CA_LOCATION": str(secured.pki.ca),
    }

    # when
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "retrytopics.operator.cli",
            "topics",
            "describe",
            "--topic",
            source,
            "--group",
            "billing",
            "--delays",
            "200ms,400ms",
            "--log-level",
            "DEBUG",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    # then: exit 1, the cause and the settings to check on stderr, no password anywhere
    assert result.returncode == 1, result.stderr[-2000:]
    hints = [line for line in result.stderr.splitlines() if line.startswith("retrytopics: hint:")]
    assert len(hints) == 1 and "refused the credentials" in hints[0] and "kafka.sasl_password" in hints[0], hints
    assert "DEBUG" in result.stderr, "DEBUG lines were printed, so the check covers them"
    for secret in (*secured.secrets, wrong):
        assert secret not in result.stdout + result.stderr


def test_upstream_and_replay_principals_cannot_write_a_tier_or_the_dlq(
    secured: Secured, unique_name: Callable[[str], str]
) -> None:
    # setup
    app, source = pipeline(secured, unique_name, secured.kafka("billing"), POLICY)
    topics = app.topics(source)
    refused = KafkaError.TOPIC_AUTHORIZATION_FAILED

    # when / then: upstream writes the source, and nothing it sends to a tier or the DLQ is accepted
    assert _produce(secured.kafka("upstream"), source, [b"order"]) == [None]
    for topic in (*[tier.topic for tier in topics.tiers], topics.dlq):
        outcomes = _produce(secured.kafka("upstream"), topic, [b"forged due time"])
        assert [err.code() if err else None for err in outcomes] == [refused], topic
    # the replay principal writes its original topic, never a tier
    assert _produce(secured.kafka("replay"), source, [b"replayed"]) == [None]
    outcomes = _produce(secured.kafka("replay"), topics.tiers[0].topic, [b"replayed into a tier"])
    assert [err.code() if err else None for err in outcomes] == [refused]
    kit = Kit(secured.broker.kafka_config())
    assert [kit.read_all(t.topic) for t in topics.tiers] == [[], []] and kit.read_all(topics.dlq) == []
    assert sorted(r.value for r in kit.read_all(source)) == [b"order", b"replayed"]
