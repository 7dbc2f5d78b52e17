"""TLS, SASL/SCRAM and ACLs on a real path (issue 15 item 4), on one Apache Kafka broker for the module.

The broker has a SASL_SSL listener (SCRAM-SHA-512, a certificate signed by a CA this module generates, PEM)
and the standard authorizer: no ACL, no access. Principals and the ACLs docs/operations.md recommends:
- `upstream` WRITEs the source topic, nothing else;
- `billing` (the framework: main and tier consumers) READs the source and every tier, and its groups (the
  app's group, and each tier's group, named after the tier topic); WRITEs every tier and the DLQ. No CREATE:
  the topics are provisioned by `admin`, the super user;
- `replay` READs the DLQ and its ledger, WRITEs the source (its allowlisted original topic) and the ledger.

Guarantees: the app runs end to end under exactly those ACLs, configured only through `KafkaConfig` fields;
a wrong CA or a wrong password fails at start-up with an error that names the cause and what to check, and no
password (nor the key's) appears in any log line at DEBUG; an upstream producer cannot write a tier or the
DLQ (TOPIC_AUTHORIZATION_FAILED), nor can the replay principal write a tier.
"""

from __future__ import annotations

import gc
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.apache import ApacheKafkaBroker
from retrytopics.connectors.apache_security import BrokerSecurity
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import last_client_error, make_admin, make_producer
from retrytopics.errors import KafkaClientError
from retrytopics.headers import DlqReason, decode
from retrytopics.preflight import connection_hint

from ..runtime.conftest import Kit, wait_until
from .pki import Pki, make_pki

pytestmark = pytest.mark.broker

USERS = ("admin", "billing", "upstream", "replay")
POLICY = RetryPolicy(delays=["200ms", "400ms"], non_retryable=(ValueError,))


class Secured:
    """The module's broker, its PKI and its users' passwords."""

    def __init__(self, broker: ApacheKafkaBroker, security: BrokerSecurity, pki: Pki) -> None:
        self.broker = broker
        self.security = security
        self.pki = pki
        self.admin = make_admin(broker.kafka_config())

    def kafka(self, user: str, **fields: str) -> KafkaConfig:
        """`user`'s KafkaConfig over SASL_SSL; `fields` replace some (a wrong password, another CA)."""
        return self.broker.kafka_config(**{**self.security.client_fields(user), **fields})

    @property
    def secrets(self) -> list[str]:
        return [*self.security.users.values(), self.pki.key_password]

    def allow(self, principal: str, resource: ResourceType, name: str, *operations: AclOperation) -> None:
        bindings = [AclBinding(resource, name, ResourcePatternType.LITERAL, f"User:{principal}", "*", op,
                               AclPermissionType.ALLOW) for op in operations]  # fmt: skip
        for future in self.admin.create_acls(bindings, request_timeout=15).values():
            future.result()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    users = {name: secrets.token_urlsafe(18) for name in USERS}
    security = BrokerSecurity(keystore=pki.keystore, truststore=pki.ca, users=users, admin="admin",
                              key_password=pki.key_password)  # fmt: skip
    with ApacheKafkaBroker(security=security) as broker:
        yield Secured(broker, security, pki)


def _pipeline(
    secured: Secured, unique_name: Callable[[str], str], kafka: KafkaConfig,
    handle: Callable[[Record[bytes]], None] = lambda record: None,
) -> tuple[RetryApp, str]:  # fmt: skip
    """An app for a fresh source topic whose topics `admin` provisioned and whose ACLs are granted."""
    source = unique_name("orders")
    app = RetryApp(kafka=kafka, group=unique_name("billing"),
                   consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})  # fmt: skip
    app.handler(source, policy=POLICY)(handle)
    topics = app.topics(source)
    ensure_topics(secured.admin, [TopicSpec(name=t, partitions=2) for t in (source, *topics.all_topics)])
    tiers = [tier.topic for tier in topics.tiers]
    secured.allow("upstream", ResourceType.TOPIC, source, AclOperation.WRITE)
    for topic in (source, *tiers):
        secured.allow("billing", ResourceType.TOPIC, topic, AclOperation.READ)
    for topic in (*tiers, topics.dlq):
        secured.allow("billing", ResourceType.TOPIC, topic, AclOperation.WRITE)
    for group in (app.group, *tiers):  # a tier consumer's group is its topic's name
        secured.allow("billing", ResourceType.GROUP, group, AclOperation.READ)
    ledger = f"{topics.dlq}.replays"
    ensure_topics(secured.admin, [TopicSpec(name=ledger, partitions=1)])
    secured.allow("replay", ResourceType.TOPIC, topics.dlq, AclOperation.READ)
    secured.allow("replay", ResourceType.TOPIC, ledger, AclOperation.READ, AclOperation.WRITE)
    secured.allow("replay", ResourceType.TOPIC, source, AclOperation.WRITE)
    return app, source


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

    app, source = _pipeline(secured, unique_name, secured.kafka("billing"), handle)
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
    assert reasons == {**{f"broken-{i}".encode(): DlqReason.EXHAUSTED for i in range(6)},
                       **{f"bad-{i}".encode(): DlqReason.NON_RETRYABLE for i in range(6)}}  # fmt: skip
    assert calls == {**{f"ok-{i}".encode(): 1 for i in range(6)}, **{f"flaky-{i}".encode(): 2 for i in range(6)},
                     **{f"broken-{i}".encode(): 3 for i in range(6)}, **{f"bad-{i}".encode(): 1 for i in range(6)}}  # fmt: skip
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
    fields = ({"sasl_password": secrets.token_urlsafe(18)} if wrong == "password"
              else {"ssl_ca_location": str(secured.pki.other_ca)})  # fmt: skip
    kafka = secured.kafka("billing", **fields).with_overrides({"debug": "security,broker"})
    app, _source = _pipeline(secured, unique_name, kafka)

    # when: the app's first contact with the cluster
    with pytest.raises(KafkaClientError) as failure:
        app.provision(timeout="3s")
    message, hint = str(failure.value), connection_hint(failure.value.code, last_client_error())
    del failure
    gc.collect()  # the failed admin client goes, so that no later test reads its background error

    # then: the error says why, the CLI's hint and the log what to check; no password or key password anywhere
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "retrytopics.kafka"]
    if wrong == "password":
        assert "Authentication failed" in message and "SCRAM-SHA-512" in message
        assert hint is not None and "kafka.sasl_password" in hint
        assert [w for w in warnings if "refused the credentials" in w and "kafka.sasl_password" in w]
    else:
        assert "certificate verify failed" in message
        assert hint is not None and "kafka.ssl_ca_location" in hint
        assert [w for w in warnings if "certificate verify failed" in w and "kafka.ssl_ca_location" in w]
    assert [r for r in caplog.records if r.name == "retrytopics.librdkafka"], "librdkafka's debug lines were checked too"
    _assert_no_secret(secured, caplog, message, hint, also=tuple(fields.values()) if wrong == "password" else ())


def test_upstream_and_replay_principals_cannot_write_a_tier_or_the_dlq(
    secured: Secured, unique_name: Callable[[str], str]
) -> None:
    # setup
    app, source = _pipeline(secured, unique_name, secured.kafka("billing"))
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
