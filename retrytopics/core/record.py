"""The record a handler receives: coordinates, key, decoded value, user headers and retry metadata.

Pure: standard library only. `retry` is None on the first delivery (a record from the source topic) and the
decoded ``retry.*`` headers on a retry tier; user code never sees ``retry.*`` headers in `headers`::

    @app.handler("orders", policy=RetryPolicy(delays=["5s", "30s"]))
    def charge(record: Record[dict]) -> None:
        if record.attempt > 1:
            log.info("retry %d of %s", record.reconsume_times, record.origin_message_id)
"""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

from retrytopics.core.headers import Header, RetryHeaders

__all__ = ["Record"]

V = TypeVar("V")


class Record(NamedTuple, Generic[V]):
    """One consumed record, as handed to a handler; immutable (`record._replace(value=...)` makes a copy).

    `key` and `raw_value` are the bytes as consumed (None for a Kafka null); `value` is what the handler's
    value deserializer made of `raw_value`. `origin_message_id` stays the same across every retry of one
    source record: use it as an idempotency key for side effects.

    A NamedTuple, not a frozen dataclass: one is built per handler call, and a NamedTuple is several times
    cheaper to build (bench/findings.md, section 9).
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: V
    raw_value: bytes | None
    headers: tuple[Header, ...]
    retry: RetryHeaders | None
    origin_message_id: str

    @property
    def reconsume_times(self) -> int:
        """Failures so far: 0 on the first delivery, 1 on the first retry, ..."""
        return 0 if self.retry is None else self.retry.reconsume_times

    @property
    def attempt(self) -> int:
        """This handler call's number, starting at 1."""
        return self.reconsume_times + 1

    @property
    def is_retry(self) -> bool:
        return self.retry is not None

    def header(self, name: str) -> bytes | None:
        """The last value of user header `name`, or None."""
        for key, value in reversed(self.headers):
            if key == name:
                return value
        return None
