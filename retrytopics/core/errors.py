"""The one error tree of retrytopics, plus the control signals a handler raises.

    RetryTopicsError
    ├── ConfigError(field, value, reason)        bad configuration; raised at start-up, names the field
    ├── HeaderDecodeError(field, value, reason)  malformed retry headers on a tier record
    │                                            (the router turns it into DLQ reason `invalid_retry_headers`)
    ├── KeyStateDecodeError(field, value, reason)
    │                                            a malformed record in a key-state topic (keyorder/)
    ├── DeliveryLimitReached(delivery_count, limit)
    │                                            a share group delivered a record to its limit without a
    │                                            hand-off (DLQ reason `delivery_limit`)
    ├── PoisonRecordError(topic, partition, offset, raw, cause)
    │                                            the configured deserializer could not decode a value
    │                                            (DLQ reason `poison`, never retried)
    ├── KafkaClientError(code, retriable, fatal) a broker/client error, translated from confluent-kafka in
    │   │                                        exactly one place: `retrytopics.connectors.kafka.map_kafka_errors`
    │   ├── PublishError(topic)                  a republish or DLQ publish was not acknowledged
    │   └── TopicMismatchError(topic, expected_partitions, actual_partitions)
    │                                            an existing topic does not match what provisioning asked for
    └── EmbeddedBrokerError                      the embedded (tansu) broker could not start or run
        ├── BrokerBinaryMissing                  the `embedded` extra is not installed
        ├── BrokerPortInUse                      the requested port is taken
        └── BrokerExitedEarly(log_tail)          the process died during start-up

Control signals are not errors; a handler raises them to steer the retry:

    Retry(after="30s")     retry, and wait at least this long (acts like a retry-after hint)
    NonRetryable(cause)    go straight to the DLQ with reason `non_retryable`
    BatchFailed([(record, exc), ...])
                           a batch handler's failed records; the others of the call succeeded
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

__all__ = [
    "BatchFailed",
    "BrokerBinaryMissing",
    "BrokerExitedEarly",
    "BrokerPortInUse",
    "ConfigError",
    "DeliveryLimitReached",
    "EmbeddedBrokerError",
    "HeaderDecodeError",
    "KafkaClientError",
    "KeyStateDecodeError",
    "NonRetryable",
    "PoisonRecordError",
    "PublishError",
    "Retry",
    "RetryTopicsError",
    "TopicMismatchError",
]


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...], fields: dict[str, Any]) -> BaseException:
    """An error made again from what pickling kept, without calling its `__init__` (whose signature is the
    error's own, not its message's)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


class _PicklesWithFields:
    """Errors and signals cross process boundaries (a user's multiprocessing pool, a task queue): each comes
    back as the same class with the same message and fields."""

    def __reduce__(self) -> tuple[Any, ...]:
        assert isinstance(self, BaseException)
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


class RetryTopicsError(_PicklesWithFields, Exception):
    """Base class of every error retrytopics raises."""


class ConfigError(RetryTopicsError, ValueError):
    """A configuration value is invalid. Raised at start-up; `field` names the offending setting."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


class DeliveryLimitReached(RetryTopicsError):
    """A share group delivered a record `delivery_count` times, its `share.delivery.count.limit`, and no
    hand-off of it was ever recorded: the process stopped on it each time. Dead-lettered with reason
    `delivery_limit` rather than handled once more (one more crash and the broker would archive it)."""

    def __init__(self, delivery_count: int, limit: int) -> None:
        self.delivery_count = delivery_count
        self.limit = limit
        super().__init__(
            f"delivered {delivery_count} times (the share group's delivery count limit is {limit}) without a "
            "hand-off: the consumer stopped on it each time"
        )


class HeaderDecodeError(RetryTopicsError):
    """A retry header is missing, malformed or out of range. Never crashes a consumer: the record is
    dead-lettered with reason `invalid_retry_headers`. `value` is a bounded, printable excerpt."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"header {field}={value!r}: {reason}")


class KeyStateDecodeError(RetryTopicsError):
    """A record of a key-state topic (key-ordered retries) is malformed: it is skipped and counted, never
    trusted. `value` is a bounded, printable excerpt."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"key state {field}={value!r}: {reason}")


class PoisonRecordError(RetryTopicsError):
    """The configured deserializer could not decode a record. Keeps the raw bytes for the DLQ."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        raw: bytes | None,
        cause: BaseException,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.raw = raw
        self.cause = cause
        super().__init__(f"cannot decode {topic}[{partition}]@{offset}: {type(cause).__name__}: {cause}")


class KafkaClientError(RetryTopicsError):
    """A Kafka client or broker error. `retriable` and `fatal` follow librdkafka's classification;
    a fatal error means the producer must be recreated. `abortable`: a transactional call failed and the
    transaction can only be aborted, after which the producer goes on (librdkafka's `txn_requires_abort`)."""

    def __init__(
        self, message: str, *, code: str = "", retriable: bool = False, fatal: bool = False, abortable: bool = False
    ) -> None:
        self.code = code
        self.retriable = retriable
        self.fatal = fatal
        self.abortable = abortable
        super().__init__(message)


class PublishError(KafkaClientError):
    """A record could not be published (no acknowledgement with acks=all)."""

    def __init__(
        self, topic: str, message: str, *, code: str = "", retriable: bool = False, fatal: bool = False
    ) -> None:
        self.topic = topic
        super().__init__(f"publish to {topic!r} failed: {message}", code=code, retriable=retriable, fatal=fatal)


class TopicMismatchError(KafkaClientError):
    """An existing topic's partition count differs from what provisioning asked for."""

    def __init__(self, topic: str, expected_partitions: int, actual_partitions: int) -> None:
        self.topic = topic
        self.expected_partitions = expected_partitions
        self.actual_partitions = actual_partitions
        super().__init__(
            f"topic {topic!r} exists with {actual_partitions} partitions, "
            f"but {expected_partitions} were asked for; retrytopics never changes partition counts "
            "(that would move keys between partitions); fix the topic or the configuration",
            code="TOPIC_MISMATCH",
        )


class EmbeddedBrokerError(RetryTopicsError):
    """The embedded broker could not be started or stopped."""


class BrokerBinaryMissing(EmbeddedBrokerError):
    """The tansu binary is not installed."""


class BrokerPortInUse(EmbeddedBrokerError):
    """The port asked for is already bound by another process."""


class BrokerExitedEarly(EmbeddedBrokerError):
    """The broker process exited before it answered a metadata request."""

    def __init__(self, message: str, log_tail: str) -> None:
        self.log_tail = log_tail
        super().__init__(f"{message}\n--- broker log (tail) ---\n{log_tail}")


class Retry(_PicklesWithFields, Exception):
    """Raised by a handler to ask for a retry no sooner than `after`.

    The record goes to the first tier whose delay is at least `after` (never early)::

        raise Retry(after="30s") from exc

    The hint only sets the delay: the tier and DLQ records describe the cause (`from exc`, or the exception
    being handled), as for `NonRetryable(cause)`; a Retry without a cause describes itself.
    """

    def __init__(self, message: str = "retry requested", *, after: str | timedelta | None = None) -> None:
        self.after = after
        super().__init__(message)

    @property
    def retry_after(self) -> str | timedelta | None:
        """The hint the classifier reads; same attribute name as an HTTP 429 exception would carry."""
        return self.after


class NonRetryable(_PicklesWithFields, Exception):
    """Raised by a handler (usually `raise NonRetryable(exc) from exc`) to dead-letter the record at once
    with reason `non_retryable`. The DLQ's exception headers describe the wrapped cause."""

    def __init__(self, cause: BaseException | str) -> None:
        self.cause = cause
        super().__init__(str(cause))


class BatchFailed(_PicklesWithFields, Exception):
    """Raised by a batch handler (`@app.batch_handler`) when some records of its call failed: each with its
    own exception, routed by the policy as a single handler's failure would be (`Retry`, `NonRetryable`
    included). Every record of the call not named here succeeded::

        @app.batch_handler("orders", policy=policy)
        def charge_all(records: list[Record[dict]]) -> None:
            failed = [(r, exc) for r, exc in charge_many(records) if exc is not None]
            if failed:
                raise BatchFailed(failed)

    Any other exception fails every record of the call. Records are matched by their coordinates (topic,
    partition, offset); naming a record that is not in the call fails the whole call, so that nothing a
    handler meant to fail is taken for a success.
    """

    def __init__(self, failures: Iterable[tuple[Any, BaseException]]) -> None:
        self.failures: list[tuple[Any, BaseException]] = list(failures)
        super().__init__(f"{len(self.failures)} records of the batch failed")


# The facade exports this module as `retrytopics.errors`, and a failure's type travels in its records'
# `retry.exception_type` header: the classes carry that public name, so what a DLQ record says stays the
# same wherever the package keeps the module.
PUBLIC_MODULE = "retrytopics.errors"
for _name in __all__:
    globals()[_name].__module__ = PUBLIC_MODULE
