"""Log lines about a record carry its identity; JSON lines parse."""

from __future__ import annotations

import json
import logging

from retrytopics.logs import JsonFormatter, TextFormatter


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
