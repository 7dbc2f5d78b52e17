"""confluent-kafka client factories with this product's safe defaults, and the one place where
confluent-kafka exceptions become retrytopics errors (`map_kafka_errors`).

Defaults and why:
- producers are idempotent with acks=all: a republish that the broker acknowledged is durable, and a
  retried send never duplicates a record within a producer session;
- consumers never auto-commit and never auto-store offsets: the runtime commits only what was handled
  or durably republished;
- `allow.auto.create.topics=false`: a typo must not silently create a topic; provisioning is explicit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from retrytopics.connectors.config import KafkaConfig, redact
from retrytopics.errors import KafkaClientError, PublishError

__all__ = [
    "CONSUMER_DEFAULTS",
    "PRODUCER_DEFAULTS",
    "delivery_error",
    "make_admin",
    "make_consumer",
    "make_producer",
    "map_kafka_errors",
    "open_tail",
]

log = logging.getLogger("retrytopics.kafka")
_librdkafka_log = logging.getLogger("retrytopics.librdkafka")

Properties = Mapping[str, str | int | float | bool]

PRODUCER_DEFAULTS: dict[str, str | int | float | bool] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "none",
}

CONSUMER_DEFAULTS: dict[str, str | int | float | bool] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "allow.auto.create.topics": False,
    "isolation.level": "read_committed",
}


def _log_client_error(err: KafkaError) -> None:
    # Transport errors are retried by librdkafka itself; they are worth a warning, not an exception.
    level = logging.ERROR if err.fatal() else logging.WARNING
    log.log(level, "kafka client error: %s", err)


def _build(base: Properties, defaults: Properties, overrides: Properties | None) -> dict[str, Any]:
    config: dict[str, Any] = {**defaults, **base, **(overrides or {})}
    config.setdefault("error_cb", _log_client_error)
    config.setdefault("logger", _librdkafka_log)
    return config


def make_producer(
    kafka: KafkaConfig, *, transactional_id: str | None = None, overrides: Properties | None = None
) -> Producer:
    """An idempotent, acks=all producer; transactional when `transactional_id` is given."""
    config = _build(kafka.producer_config(), PRODUCER_DEFAULTS, overrides)
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    log.debug("creating producer %s", redact(config))
    with map_kafka_errors():
        return Producer(config)


def make_consumer(kafka: KafkaConfig, *, group_id: str | None, overrides: Properties | None = None) -> Consumer:
    """A manually-committing consumer. `group_id=None` gives a throwaway id for assign()-only readers,
    which never join a group (librdkafka insists on a group.id even then)."""
    config = _build(kafka.consumer_config(), CONSUMER_DEFAULTS, overrides)
    config["group.id"] = group_id or f"retrytopics-reader-{uuid.uuid4().hex}"
    log.debug("creating consumer %s", redact(config))
    with map_kafka_errors():
        return Consumer(config)


def make_admin(kafka: KafkaConfig, *, overrides: Properties | None = None) -> AdminClient:
    """An admin client for provisioning and offset queries."""
    config: dict[str, Any] = {**kafka.client_config(), **(overrides or {})}
    config.setdefault("error_cb", _log_client_error)
    config.setdefault("logger", _librdkafka_log)
    with map_kafka_errors():
        return AdminClient(config)


def _from_kafka_error(err: KafkaError) -> KafkaClientError:
    return KafkaClientError(
        f"{err.name()}: {err.str()}", code=err.name(), retriable=err.retriable(), fatal=err.fatal()
    )


@contextmanager
def map_kafka_errors() -> Iterator[None]:
    """Translate confluent-kafka exceptions into `KafkaClientError` (raised `from` the original)."""
    try:
        yield
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError):
            raise _from_kafka_error(err) from exc
        raise KafkaClientError(str(exc)) from exc


def delivery_error(err: KafkaError, topic: str) -> PublishError:
    """A delivery-report error as a `PublishError` naming the destination topic."""
    return PublishError(topic, err.str(), code=err.name(), retriable=err.retriable(), fatal=err.fatal())


def open_tail(kafka: KafkaConfig, topic: str, partitions: int, *, last: int) -> Consumer:
    """An assign()-only consumer (no group, no commits) positioned `last` records before the end of each
    partition of `topic`."""
    consumer = make_consumer(kafka, group_id=None)
    assignment = []
    with map_kafka_errors():
        for partition in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
            assignment.append(TopicPartition(topic, partition, max(low, high - last)))
        consumer.assign(assignment)
    return consumer
