"""The consumer group protocol of KIP-848 (`group.protocol=consumer`, Apache Kafka 4's default for its Java
clients): the end-to-end scenario (2,000 records through three tiers and the DLQ, every id accounted for,
nothing early, everything committed) holds with it too. Assignment is incremental there, and the broker
owns the session timeout, so the test's classic-protocol session settings are left out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.config import KafkaConfig

from .conftest import Kit
from .test_end_to_end import test_every_record_ends_exactly_once as end_to_end_scenario

pytestmark = pytest.mark.broker


def test_every_record_ends_exactly_once_with_the_consumer_group_protocol(
    broker: Any, kafka: KafkaConfig, unique_name: Callable[[str], str], apps: list[RetryApp]
) -> None:
    if broker.is_tansu:
        pytest.skip("tansu 0.6.0 does not implement the KIP-848 ConsumerGroupHeartbeat API")
    end_to_end_scenario(kafka, Kit(kafka), unique_name, {"group.protocol": "consumer"}, apps, "sync")
