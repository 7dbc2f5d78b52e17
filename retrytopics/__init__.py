"""retrytopics: non-blocking retries for Apache Kafka (delay tiers, pausing tier consumers, a DLQ).

::

    from retrytopics import KafkaConfig, RetryApp, RetryPolicy, json_value

    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9092"), group="billing")

    @app.handler("orders", policy=RetryPolicy(delays=["5s", "30s", "5m"]), value_deserializer=json_value)
    def charge(record): ...

    app.provision()
    app.run()
"""

from __future__ import annotations

from retrytopics import errors
from retrytopics.app import RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.serde import avro, avro_serializer, bytes_value, json_serializer, json_value, utf8
from retrytopics.core.concurrency import Concurrency, OrderMode
from retrytopics.core.errors import (
    BatchFailed,
    ConfigError,
    HeaderDecodeError,
    KafkaClientError,
    NonRetryable,
    PoisonRecordError,
    PublishError,
    Retry,
    RetryTopicsError,
)
from retrytopics.core.flood_guard import FloodGuard
from retrytopics.core.headers import DlqReason, RetryHeaders
from retrytopics.core.keyorder.config import DeadHeadPolicy, KeyOrdering
from retrytopics.core.naming import NamingStrategy
from retrytopics.core.policy import ROCKETMQ_LEVELS, UNLIMITED, Exponential, InProcessRetry, RetryPolicy
from retrytopics.core.record import Record
from retrytopics.observe.events import Event, Hook, LoggingHook, Stats

__all__ = [
    # Application
    "KafkaConfig",
    "Record",
    "RetryApp",
    # Policy
    "ROCKETMQ_LEVELS",
    "UNLIMITED",
    "Exponential",
    "InProcessRetry",
    "NamingStrategy",
    "RetryPolicy",
    # Key ordering
    "DeadHeadPolicy",
    "KeyOrdering",
    # Retry-flood guard
    "FloodGuard",
    # Handler concurrency
    "Concurrency",
    "OrderMode",
    # Control signals (raised by handlers)
    "BatchFailed",
    "NonRetryable",
    "Retry",
    # Serialization
    "avro",
    "avro_serializer",
    "bytes_value",
    "json_serializer",
    "json_value",
    "utf8",
    # Headers
    "DlqReason",
    "RetryHeaders",
    # Observability
    "Event",
    "Hook",
    "LoggingHook",
    "Stats",
    # Errors
    "ConfigError",
    "HeaderDecodeError",
    "KafkaClientError",
    "PoisonRecordError",
    "PublishError",
    "RetryTopicsError",
    "errors",
]
