"""The dead letters a Kafka broker (4.4+, KIP-1191) writes for a share group, as retrytopics reads them.

The broker archives a record its share group rejected or delivered `share.delivery.count.limit` times, and,
with a group DLQ set (`errors.deadletterqueue.topic.name`), writes a copy to it: key and value only with
`errors.deadletterqueue.copy.record.enable=true`, never the record's own headers, plus six headers of its
own (`__dlq.errors.topic`, `.partition`, `.offset`, `.group`, `.delivery.count` as decimal text, `.message`).
Those headers are untrusted input like every byte of a record: a header missing, repeated, not UTF-8, not a
canonical number or out of range reads as None, and the message is bounded. `retrytopics.spark.audit`
applies the same rules in Spark SQL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from retrytopics.core.naming import validate_topic_name

__all__ = [
    "BROKER_DLQ_PREFIX",
    "BROKER_REASONS",
    "DEFAULT_BROKER_REASON",
    "HEADERS",
    "MESSAGE_LIMIT",
    "BrokerDeadLetter",
    "broker_dlq_topic",
    "broker_reason",
    "decode_broker_dead_letter",
]

#: Kafka's default `errors.deadletterqueue.topic.name.prefix`: the broker refuses a group DLQ named otherwise.
BROKER_DLQ_PREFIX: Final = "dlq."

TOPIC: Final = "__dlq.errors.topic"
PARTITION: Final = "__dlq.errors.partition"
OFFSET: Final = "__dlq.errors.offset"
GROUP: Final = "__dlq.errors.group"
DELIVERY_COUNT: Final = "__dlq.errors.delivery.count"
MESSAGE: Final = "__dlq.errors.message"
HEADERS: Final = (TOPIC, PARTITION, OFFSET, GROUP, DELIVERY_COUNT, MESSAGE)

#: (text the broker's message contains, lower case; the reason retrytopics gives), first match wins. Kafka
#: 4.4 writes "Offset rejected by client." and "Offset delivery count exceeded the threshold.".
BROKER_REASONS: Final = (
    ("rejected", "broker_rejected"),
    ("delivery count exceeded", "broker_delivery_limit"),
)
#: The reason of a broker dead letter whose message says neither (a later Kafka's wording, or none).
DEFAULT_BROKER_REASON: Final = "broker_dlq"
#: Characters of the broker's message kept (it is shown and matched, never trusted).
MESSAGE_LIMIT: Final = 500
#: Characters of a group id kept: Kafka bounds none, a header is read bounded.
GROUP_LIMIT: Final = 255

_INT32: Final = 2**31 - 1
_INT64: Final = 2**63 - 1
_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_CANONICAL: Final = re.compile(r"0|[1-9][0-9]{0,18}")


def broker_dlq_topic(group: str) -> str:
    """The broker DLQ retrytopics provisions for share group `group`: `dlq.<group>`. One per group, not per
    source topic: the group config names a single topic for every topic the group reads, and each dead
    letter names its source in `__dlq.errors.topic`."""
    return validate_topic_name(f"{BROKER_DLQ_PREFIX}{group}", field="group")


def broker_reason(message: str | None) -> str:
    """The dead-letter reason for the broker's message text (see BROKER_REASONS)."""
    lowered = (message or "").lower()
    return next((reason for text, reason in BROKER_REASONS if text in lowered), DEFAULT_BROKER_REASON)


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerDeadLetter:
    """What one broker dead letter says; None where its header is missing, repeated or malformed."""

    topic: str | None
    partition: int | None
    offset: int | None
    group: str | None
    delivery_count: int | None
    message: str | None
    reason: str

    @property
    def origin_message_id(self) -> str | None:
        """The id retrytopics gives a source record without an id header, `<topic>-<partition>-<offset>`
        (the broker does not copy headers, so an id header of the record's own is lost)."""
        if self.topic is None or self.partition is None or self.offset is None:
            return None
        return f"{self.topic}-{self.partition}-{self.offset}"


def _single(headers: Sequence[tuple[str, bytes | None]], key: str) -> bytes | None:
    values = [v for k, v in headers if k == key]
    return values[0] if len(values) == 1 else None


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _number(raw: bytes | None, low: int, high: int) -> int | None:
    text = _text(raw)
    if text is None or _CANONICAL.fullmatch(text) is None:
        return None
    value = int(text)
    return value if low <= value <= high else None


def decode_broker_dead_letter(headers: Sequence[tuple[str, bytes | None]]) -> BrokerDeadLetter:
    """The broker's `__dlq.errors.*` headers of one record, decoded; never raises on any input."""
    topic = _text(_single(headers, TOPIC))
    group = _text(_single(headers, GROUP))
    message = _text(_single(headers, MESSAGE))
    message = None if message is None else message[:MESSAGE_LIMIT]
    return BrokerDeadLetter(
        topic=topic if topic is not None and _TOPIC_NAME.fullmatch(topic) else None,
        partition=_number(_single(headers, PARTITION), 0, _INT32),
        offset=_number(_single(headers, OFFSET), 0, _INT64),
        group=None if group is None else group[:GROUP_LIMIT],
        delivery_count=_number(_single(headers, DELIVERY_COUNT), 1, _INT32),
        message=message,
        reason=broker_reason(message),
    )
