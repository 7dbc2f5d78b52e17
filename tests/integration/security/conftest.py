"""One Apache Kafka broker for the security tests: SASL_SSL with SCRAM-SHA-512 users, a certificate from a CA
made here (`pki.py`), and the standard authorizer (no ACL, no access); plus the pipeline every test builds on
it, provisioned by the super user `admin` with the ACLs docs/operations.md recommends:
- `upstream` WRITEs the source topic, nothing else;
- `billing` (the framework: main and tier consumers) READs the source, every tier and the DLQ, and its groups (the
  app's group, and each tier's group, named after the tier topic); WRITEs every tier and the DLQ. No CREATE;
- `replay` READs the DLQ and its ledger, READs and WRITEs the source (its allowlisted original topic) and
  the ledger, and DESCRIBEs the group ids of assign()-only readers (a PREFIXED ACL).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.apache import ApacheKafkaBroker
from retrytopics.connectors.apache_security import BrokerSecurity
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin

from .pki import Pki, make_pki

USERS = ("admin", "billing", "upstream", "replay")
#: Group ids of assign()-only readers (`make_consumer(group_id=None)`, the Spark data source): they never join,
#: but librdkafka looks up their group's coordinator, which needs DESCRIBE on the group.
READER_GROUPS = ("retrytopics-reader-", "retrytopics-spark-")


class Secured:
    """The package's broker, its PKI and its users' passwords."""

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

    def allow(
        self,
        principal: str,
        resource: ResourceType,
        name: str,
        *operations: AclOperation,
        pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    ) -> None:
        bindings = [
            AclBinding(resource, name, pattern, f"User:{principal}", "*", op, AclPermissionType.ALLOW)
            for op in operations
        ]
        for future in self.admin.create_acls(bindings, request_timeout=15).values():
            future.result()


@pytest.fixture(scope="package")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    users = {name: secrets.token_urlsafe(18) for name in USERS}
    security = BrokerSecurity(
        keystore=pki.keystore, truststore=pki.ca, users=users, admin="admin", key_password=pki.key_password
    )
    with ApacheKafkaBroker(security=security) as broker:
        yield Secured(broker, security, pki)


def pipeline(
    secured: Secured,
    unique_name: Callable[[str], str],
    kafka: KafkaConfig,
    policy: RetryPolicy,
    handle: Callable[[Record[bytes]], None] = lambda record: None,
) -> tuple[RetryApp, str]:
    """An app for a fresh source topic whose topics `admin` provisioned, with the ACLs of docs/operations.md
    granted to `upstream`, `billing` and `replay`."""
    source = unique_name("orders")
    app = RetryApp(
        kafka=kafka,
        group=unique_name("billing"),
        consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500},
    )
    app.handler(source, policy=policy)(handle)
    topics = app.topics(source)
    ensure_topics(secured.admin, [TopicSpec(name=t, partitions=2) for t in (source, *topics.all_topics)])
    tiers = [tier.topic for tier in topics.tiers]
    secured.allow("upstream", ResourceType.TOPIC, source, AclOperation.WRITE)
    for topic in (source, *tiers, topics.dlq):  # the DLQ too: its tail seeds the duplicate check at assignment
        secured.allow("billing", ResourceType.TOPIC, topic, AclOperation.READ)
    for topic in (*tiers, topics.dlq):
        secured.allow("billing", ResourceType.TOPIC, topic, AclOperation.WRITE)
    for group in (app.group, *tiers):  # a tier consumer's group is its topic's name
        secured.allow("billing", ResourceType.GROUP, group, AclOperation.READ)
    ledger = f"{topics.dlq}.replays"
    ensure_topics(secured.admin, [TopicSpec(name=ledger, partitions=1)])
    secured.allow("replay", ResourceType.TOPIC, topics.dlq, AclOperation.READ)
    secured.allow("replay", ResourceType.TOPIC, ledger, AclOperation.READ, AclOperation.WRITE)
    # READ too: a rerun scans the original topic for what its first run already wrote
    secured.allow("replay", ResourceType.TOPIC, source, AclOperation.READ, AclOperation.WRITE)
    for prefix in READER_GROUPS:
        secured.allow("replay", ResourceType.GROUP, prefix, AclOperation.DESCRIBE, pattern=ResourcePatternType.PREFIXED)
    return app, source
