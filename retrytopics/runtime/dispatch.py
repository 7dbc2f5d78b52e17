"""Calling a handler: the binding of a topic to its handler, decoding, the Record, in-process retries and
the runtime-owned event loop for `async def` handlers."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from retrytopics.classify import Verdict, classify
from retrytopics.connectors.serde import Deserializer, bytes_value, deserialize
from retrytopics.errors import PoisonRecordError
from retrytopics.headers import RetryHeaders, user_headers
from retrytopics.policy import RetryPolicy
from retrytopics.ports import Message
from retrytopics.record import Record
from retrytopics.router import InboundRecord, RouteContext, origin_message_id

__all__ = ["Binding", "Invoker", "build_record", "inbound"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    """A handler bound to a source topic, with everything needed to route its failures."""

    topic: str
    handler: Callable[[Record[Any]], Any]
    policy: RetryPolicy
    ctx: RouteContext
    value_deserializer: Deserializer

    @property
    def name(self) -> str:
        return getattr(self.handler, "__qualname__", repr(self.handler))


def inbound(msg: Message) -> InboundRecord:
    return InboundRecord(
        topic=msg.topic, partition=msg.partition, offset=msg.offset,
        timestamp_ms=msg.timestamp_ms, key=msg.key, headers=msg.headers, value=msg.value,
    )  # fmt: skip


def build_record(binding: Binding, msg: Message, state: RetryHeaders | None) -> tuple[Record[Any], PoisonRecordError | None]:
    """The handler's Record; on a decode failure, a Record with `value=None` and the poison error."""
    value: Any = msg.value
    poison: PoisonRecordError | None = None
    if binding.value_deserializer is not bytes_value:  # the default needs no call (nor its context)
        try:
            value = deserialize(
                binding.value_deserializer, msg.value, topic=msg.topic, partition=msg.partition,
                offset=msg.offset, headers=msg.headers,
            )  # fmt: skip
        except PoisonRecordError as exc:
            value, poison = None, exc
    if msg.header_error is not None and poison is None:  # a header key the client could not read
        poison = PoisonRecordError(msg.topic, msg.partition, msg.offset, msg.value, msg.header_error)
    if state is not None:
        origin = state.origin_message_id
    elif binding.ctx.id_header is None:  # the common case, without building an InboundRecord per record
        origin = f"{msg.topic}-{msg.partition}-{msg.offset}"
    else:
        origin = origin_message_id(binding.ctx, inbound(msg))
    headers = tuple(user_headers(msg.headers)) if msg.headers else ()
    # positional, in field order: this runs once per handler call
    record = Record(msg.topic, msg.partition, msg.offset, msg.timestamp_ms, msg.key, value, msg.value, headers,
                    state, origin)  # fmt: skip
    return record, poison


class Invoker:
    """Runs handlers in the calling (poll) thread; coroutines run on one event loop owned by this invoker.

    `policy.in_process` retries run here, driven by tenacity, for failures the policy calls retryable; the
    waits are interruptible by `stop` so that shutdown is never delayed by a back-off.
    """

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, binding: Binding, record: Record[Any]) -> Any:
        in_process = binding.policy.in_process
        if in_process is None or in_process.attempts == 1:
            return self._once(binding.handler, record)
        policy = binding.policy
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(in_process.attempts),
            wait=tenacity.wait_fixed(in_process.wait_ms / 1000),
            retry=tenacity.retry_if_exception(
                lambda exc: isinstance(exc, Exception) and classify(policy, exc).verdict is Verdict.RETRYABLE
            ),
            sleep=self._sleep,
            reraise=True,
        )
        return retrying(self._once, binding.handler, record)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _once(self, handler: Callable[[Record[Any]], Any], record: Record[Any]) -> Any:
        result = handler(record)
        if result is None:  # most handlers: no awaitable to look for
            return None
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(result)
        return result

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
            self._loop = None
