"""Log lines about a record carry its identity; JSON lines parse."""

from __future__ import annotations

import json
import logging

from retrytopics.operator.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("retrytopics.runtime", logging.INFO, __file__, 1, "dead-lettered %s", ("x",), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_the_origin_message_id() -> None:
    line = JsonFormatter().format(_record(origin_message_id="orders-0-7", topic="orders", partition=0, offset=7))
    entry = json.loads(line)
    assert entry["message"] == "dead-lettered x"
    assert (entry["origin_message_id"], entry["partition"], entry["offset"]) == ("orders-0-7", 0, 7)
    assert entry["level"] == "INFO" and entry["ts"].endswith("Z")


def test_text_lines_append_record_fields() -> None:
    line = TextFormatter().format(_record(origin_message_id="o-1", reason="poison"))
    assert line.endswith("[origin_message_id=o-1 reason=poison]")
    assert "[" not in TextFormatter().format(_record()).split("dead-lettered x")[1]


def test_a_broker_outage_is_logged_when_it_starts_and_when_its_cause_changes() -> None:
    from confluent_kafka import KafkaError

    from retrytopics.connectors.kafka import OutageLog

    now = [0.0]
    outage = OutageLog(quiet_s=30, clock=lambda: now[0])
    refused = KafkaError(KafkaError._TRANSPORT, "Connect to ipv4#127.0.0.1:1 failed: Connection refused")
    levels = []
    for step in range(20):  # a reconnect attempt every 0.5 s, each reported twice by librdkafka
        now[0] = step * 0.5
        levels += [outage.level(refused), outage.level(KafkaError(KafkaError._ALL_BROKERS_DOWN, "all down"))]
    assert levels.count(logging.WARNING) == 1 and levels[0] == logging.WARNING
    assert outage.level(KafkaError(KafkaError._SSL, "certificate verify failed")) == logging.WARNING, "a new cause"
    now[0] += 31  # no connection error for longer than any reconnect back-off: the brokers were back
    assert outage.level(refused) == logging.WARNING, "a second outage"
    assert outage.level(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "x")) == logging.WARNING, "not an outage"


def test_librdkafka_connect_failures_are_not_logged_twice(caplog) -> None:
    import retrytopics.connectors.kafka  # noqa: F401 - installs the filter

    librdkafka = logging.getLogger("retrytopics.librdkafka")
    with caplog.at_level(logging.INFO, logger="retrytopics.librdkafka"):
        librdkafka.error("%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connect to ipv4#127.0.0.1:1 failed")
        librdkafka.warning("%s [%s] %s", "CONFWARN", "rdkafka#consumer-1", "a property is ignored")
    assert [r.args[0] for r in caplog.records] == ["CONFWARN"]


def test_json_lines_carry_event_fields_as_keys() -> None:
    from retrytopics.observe.events import Event, LoggingHook

    records: list[logging.LogRecord] = []
    logger = logging.getLogger("test.events.json")
    logger.setLevel(logging.INFO)
    logger.addHandler(type("Keep", (logging.Handler,), {"emit": lambda self, r: records.append(r)})())
    LoggingHook(logger).on_event(
        Event.DLQ_DISPATCHED, {"topic": "orders", "partition": 2, "offset": 9, "reason": "poison", "message": "x"}
    )
    entry = json.loads(JsonFormatter().format(records[0]))
    assert entry["event"] == "dlq.dispatched"
    assert (entry["topic"], entry["partition"], entry["offset"], entry["reason"]) == ("orders", 2, 9, "poison")
    assert entry["message"].startswith("dlq.dispatched "), "a field named like a line key does not replace it"


def test_a_tls_failure_reported_under_two_codes_is_one_outage() -> None:
    """librdkafka reports a failed handshake as _SSL, then as _TRANSPORT, at every reconnect."""
    from confluent_kafka import KafkaError

    from retrytopics.connectors.kafka import OutageLog

    now = [0.0]
    outage = OutageLog(quiet_s=30, clock=lambda: now[0])
    levels = []
    for step in range(10):
        now[0] = step * 0.5
        levels += [
            outage.level(KafkaError(KafkaError._SSL, "SSL handshake failed")),
            outage.level(KafkaError(KafkaError._TRANSPORT, "wrong version number")),
        ]
    assert levels[:2] == [logging.WARNING, logging.WARNING]
    assert set(levels[2:]) == {logging.DEBUG}
