"""The public error tree, importable as `retrytopics.errors` (the tree is drawn in `retrytopics.core.errors`).

Every class here names this module as its `__module__`: a failure's type travels in its records'
`retry.exception_type` header, and pickling finds a class by that name.
"""

from __future__ import annotations

from retrytopics.core.errors import (
    BatchFailed,
    BrokerBinaryMissing,
    BrokerExitedEarly,
    BrokerPortInUse,
    ConfigError,
    DeliveryLimitReached,
    EmbeddedBrokerError,
    HeaderDecodeError,
    KafkaClientError,
    KeyStateDecodeError,
    NonRetryable,
    PoisonRecordError,
    PublishError,
    Retry,
    RetryTopicsError,
    TopicMismatchError,
)

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
