"""Smoke: the end-to-end scenario (2,000 records through three tiers and the DLQ, every id accounted for)
also holds on the embedded tansu broker, which the demo starts by default. The suite's broker is Apache
Kafka; this module starts tansu itself, whatever broker the session selected."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.embedded import EmbeddedBroker

from .conftest import Kit
from .test_end_to_end import test_every_record_ends_exactly_once as end_to_end_scenario

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def tansu() -> Iterator[KafkaConfig]:
    with EmbeddedBroker() as broker:
        yield broker.kafka_config()


def test_every_record_ends_exactly_once_on_tansu(
    tansu: KafkaConfig, unique_name: Callable[[str], str], consumer_overrides: dict[str, Any], apps: list[RetryApp]
) -> None:
    end_to_end_scenario(tansu, Kit(tansu), unique_name, consumer_overrides, apps, "sync")
