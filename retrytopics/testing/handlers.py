"""Unit-test handlers without Kafka: build Records, call sync or async handlers, and ask where a failure
would be routed. Not a Kafka mock: every delivery guarantee is proven on a real broker by the test suite.

::

    from retrytopics.testing import call, make_record, route_for

    def test_charge_retries_on_timeouts():
        record = make_record({"order_id": "o-1"}, topic="orders", attempt=2)
        with pytest.raises(TimeoutError):
            call(charge, record)
        decision = route_for(app, record, TimeoutError("gateway"))
        assert decision.topic == "orders.billing.retry.30s"
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from retrytopics.app import RetryApp
from retrytopics.core.headers import Header, RetryHeaders, encode
from retrytopics.core.record import Record
from retrytopics.core.router import InboundRecord, Route, route
from retrytopics.core.signing import sign

__all__ = ["call", "make_record", "route_for"]

V = TypeVar("V")


def make_record(
    value: V,
    *,
    topic: str = "test",
    partition: int = 0,
    offset: int = 0,
    key: bytes | None = None,
    headers: Sequence[Header] = (),
    raw_value: bytes | None = None,
    timestamp_ms: int = 0,
    attempt: int = 1,
    group: str = "test",
    origin_message_id: str | None = None,
    now_ms: int | None = None,
) -> Record[V]:
    """A Record as a handler would receive it. `attempt > 1` gives it retry metadata as if it had failed
    `attempt - 1` times (on tier `attempt - 2`); `topic` is then the *original* topic."""
    if attempt < 1:
        raise ValueError(f"attempt={attempt}: attempts start at 1")
    origin = origin_message_id or f"{topic}-{partition}-{offset}"
    retry: RetryHeaders | None = None
    if attempt > 1:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        retry = RetryHeaders(
            reconsume_times=attempt - 1,
            origin_message_id=origin,
            original_topic=topic,
            original_partition=partition,
            original_offset=offset,
            original_timestamp=timestamp_ms,
            consumer_group=group,
            tier=min(attempt - 2, 99),
            due_at=now,
            first_failed_at=now,
            last_failed_at=now,
            exception_type="builtins.RuntimeError",
            exception_message="",
            exception_trace="",
        )
    return Record(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        key=key,
        value=value,
        raw_value=raw_value,
        headers=tuple(headers),
        retry=retry,
        origin_message_id=origin,
    )


def call(handler: Callable[[Record[Any]], Any], record: Record[Any]) -> Any:
    """Call a sync or `async def` handler with `record` and return its result (exceptions propagate)."""
    result = handler(record)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def route_for(
    app: RetryApp, record: Record[Any], failure: BaseException, *, now_ms: int | None = None, seed: int = 0
) -> Route:
    """Where `app` would send `record` if its handler raised `failure` (for a Record from `make_record`)."""
    retry = record.retry
    ctx = app.handlers[retry.original_topic if retry is not None else record.topic].ctx
    now = int(time.time() * 1000) if now_ms is None else now_ms
    topic, headers = record.topic, tuple(record.headers)
    if retry is not None:
        tier = ctx.topics.tiers[min(retry.tier or 0, len(ctx.topics.tiers) - 1)]
        retry = dataclasses.replace(retry, tier=tier.index, consumer_group=ctx.group)
        topic, headers = tier.topic, headers + tuple(encode(retry))
        if ctx.header_keys is not None:  # as the app's own previous hop would have signed it
            headers = sign(ctx.header_keys, topic, record.key, record.raw_value, headers)
    inbound = InboundRecord(
        topic=topic,
        partition=record.partition,
        offset=record.offset,
        timestamp_ms=record.timestamp_ms,
        key=record.key,
        headers=headers,
        value=record.raw_value,
    )
    return route(ctx, inbound, failure, now_ms=now, rng=random.Random(seed))
