"""py4j logs each JVM command at DEBUG; the value of a secret Kafka option in it is hidden, nothing else is."""

from __future__ import annotations

import logging

import pytest

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.spark_kafka import Py4jSecretFilter, kafka_options

COMMAND = "Command to send: c\no12\noption\nskafka.sasl.password\nsS3cr3t!\ne\n"


def test_a_secret_option_value_is_hidden_and_the_rest_kept() -> None:
    record = logging.LogRecord("py4j.clientserver", logging.DEBUG, __file__, 1, "%s", (COMMAND,), None)
    Py4jSecretFilter().filter(record)
    text = record.getMessage()
    assert "S3cr3t!" not in text and "skafka.sasl.password\ns[hidden]\n" in text
    plain = "Command to send: c\no12\noption\nskafka.bootstrap.servers\nsb:9092\ne\n"
    record = logging.LogRecord("py4j.clientserver", logging.DEBUG, __file__, 1, plain, (), None)
    Py4jSecretFilter().filter(record)
    assert record.getMessage() == plain


def test_kafka_options_guard_py4j_from_then_on(caplog: pytest.LogCaptureFixture) -> None:
    kafka_options(KafkaConfig(bootstrap="b:9092"))
    caplog.set_level(logging.DEBUG)
    logging.getLogger("py4j.clientserver").debug("Command to send: %s", COMMAND[len("Command to send: ") :])
    assert caplog.records and not [r for r in caplog.records if "S3cr3t!" in r.getMessage()]
