"""Logging set-up for the CLI: plain text or one JSON object per line.

Log calls about a record pass its identity in `extra` (`origin_message_id`, `topic`, `partition`,
`offset`, ...); the JSON formatter emits those fields, the text formatter appends them as `key=value`.
Runtime events (`LoggingHook`) pass all their fields as `extra={"event_fields": {...}}`: JSON lines carry
each as a key of its own (`{"event": "dlq.dispatched", "topic": ..., "reason": ...}`).
Secrets never reach a log line: client configs are logged only through `connectors.config.redact`.
"""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["RECORD_FIELDS", "JsonFormatter", "TextFormatter", "configure_logging"]

#: `extra` fields that identify a record or a pipeline stage in a log line.
RECORD_FIELDS = (
    "origin_message_id",
    "topic",
    "partition",
    "offset",
    "tier",
    "reason",
    "reconsume_times",
    "due_at",
    "event",
)


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in RECORD_FIELDS if hasattr(record, name)}


def _json_value(value: object) -> object:
    # keep JSON's own types; anything else (TopicPartition lists, exceptions) as its text
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(item) for item in value]
    return str(value)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        event_fields = getattr(record, "event_fields", None)
        if isinstance(event_fields, dict):
            # never let an event field replace ts, level, logger or message
            entry.update({k: _json_value(v) for k, v in event_fields.items() if k not in entry})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        return f"{text} [{extra}]" if extra else text


def configure_logging(level: str = "INFO", *, json_lines: bool = False) -> None:
    """Route retrytopics' loggers to stderr at `level`; idempotent."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger("retrytopics")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
