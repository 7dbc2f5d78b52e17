"""Calling a handler: the binding of a topic to its handler, decoding, the Record, in-process retries and
the runtime-owned event loop for `async def` handlers (part of the records stage, runtime/records/)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import tenacity

from retrytopics.connectors.serde import Deserializer, bytes_value, deserialize
from retrytopics.core.classify import Verdict, classify
from retrytopics.core.concurrency import Concurrency
from retrytopics.core.errors import BatchFailed, PoisonRecordError
from retrytopics.core.headers import RetryHeaders, user_headers
from retrytopics.core.keyorder.config import KeyOrdering
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.core.router import RouteContext, origin_message_id, tier_wait_bounds_ms

__all__ = ["Binding", "Invoker", "Run", "build_record", "build_run"]

#: consecutive records of one partition to pass to their handler: as consumed, or already built as the
#: handler's Records by the consumer (`ports.consume_runs`)
Run = list[Message] | list[Record[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    """A handler bound to a source topic, with everything needed to route its failures."""

    topic: str
    handler: Callable[[Record[Any]], Any]
    policy: RetryPolicy
    ctx: RouteContext
    value_deserializer: Deserializer
    #: the handler takes the records of one poll per partition, a list (`RetryApp.batch_handler`)
    batch: bool = False
    #: records of one key and source partition are handled in source order (docs/key-ordering.md); None: not
    ordering: KeyOrdering | None = None
    #: calls in flight at once in one consumer (runtime/concurrency/); None: one at a time, on its thread
    concurrency: Concurrency | None = None
    #: per tier topic, the longest one of its records waits (retrytopics/core/due.py), worked out once
    wait_bounds_ms: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "wait_bounds_ms", tier_wait_bounds_ms(self.ctx))

    @property
    def name(self) -> str:
        return getattr(self.handler, "__qualname__", repr(self.handler))


def build_record(
    binding: Binding, msg: Message, state: RetryHeaders | None
) -> tuple[Record[Any], PoisonRecordError | None]:
    """The handler's Record; on a decode failure, a Record with `value=None` and the poison error."""
    value: Any = msg.value
    poison: PoisonRecordError | None = None
    if binding.value_deserializer is not bytes_value:  # the default needs no call (nor its context)
        try:
            value = deserialize(
                binding.value_deserializer,
                msg.value,
                topic=msg.topic,
                partition=msg.partition,
                offset=msg.offset,
                headers=msg.headers,
            )
        except PoisonRecordError as exc:
            value, poison = None, exc
    if msg.header_error is not None and poison is None:  # a header key the client could not read
        poison = PoisonRecordError(msg.topic, msg.partition, msg.offset, msg.value, msg.header_error)
    if state is not None:
        origin = state.origin_message_id
    elif binding.ctx.id_header is None:  # the common case, without a call per record
        origin = f"{msg.topic}-{msg.partition}-{msg.offset}"
    else:
        origin = origin_message_id(binding.ctx, msg)
    headers = tuple(user_headers(msg.headers)) if msg.headers else ()
    # in field order, through tuple.__new__ (the NamedTuple's own __new__ is a Python call): once per record
    record: Record[Any] = _new_record(
        Record,
        (msg.topic, msg.partition, msg.offset, msg.timestamp_ms, msg.key, value, msg.value, headers, state, origin),
    )
    return record, poison


_new_record = tuple.__new__


def build_run(binding: Binding, msgs: list[Message]) -> list[Record[Any]] | None:
    """The Records of a plain run of source records of one partition, as `build_record` makes each, built in
    one pass; None when a record of the run fails before any call (poison), or the binding decodes values or
    takes ids from a header: the caller then builds record by record."""
    if binding.value_deserializer is not bytes_value or binding.ctx.id_header is not None:
        return None
    first = msgs[0]
    topic, partition = first.topic, first.partition
    prefix = f"{topic}-{partition}-"
    new, user = _new_record, user_headers
    records: list[Record[Any]] = []
    add = records.append
    for m in msgs:
        if m.header_error is not None:
            return None
        add(
            new(
                Record,
                (
                    topic,
                    partition,
                    m.offset,
                    m.timestamp_ms,
                    m.key,
                    m.value,
                    m.value,
                    tuple(user(m.headers)) if m.headers else (),
                    None,
                    prefix + str(m.offset),
                ),
            )
        )
    return records


class Invoker:
    """Runs handlers in the calling (poll) thread; coroutines run on one event loop owned by this invoker.

    `policy.in_process` retries run here, driven by tenacity, for failures the policy calls retryable; the
    waits are interruptible by `stop` so that shutdown is never delayed by a back-off.
    """

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the Record (or a batch handler's list) of the latest call, for a watchdog naming a stuck call
        self.calling: Record[Any] | list[Record[Any]] | None = None

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

    def caller(self, binding: Binding) -> Callable[[Record[Any]], Any]:
        """`call` for `binding`, bound once: a run of calls looks nothing up per record."""
        in_process = binding.policy.in_process
        if in_process is None or in_process.attempts == 1:
            return functools.partial(self._once, binding.handler)
        return functools.partial(self.call, binding)

    def call_batch(self, binding: Binding, records: list[Record[Any]]) -> list[BaseException | None] | None:
        """Call a batch handler once; each record's failure (None: it succeeded), or None when every record
        succeeded. A `BatchFailed` names the failed ones; any other exception fails them all. BaseException
        propagates, as for one record."""
        try:
            self._once(binding.handler, records)
        except BatchFailed as failed:
            return _outcomes(records, failed)
        except Exception as exc:  # noqa: BLE001 - the whole call failed: every record is routed
            return [exc] * len(records)
        return None

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _once(self, handler: Callable[[Any], Any], record: Record[Any] | list[Record[Any]]) -> Any:
        self.calling = record
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


def _outcomes(records: list[Record[Any]], failed: BatchFailed) -> list[BaseException | None]:
    """Each record's failure as `failed` names it, matched by coordinates. A name not in the call (or not a
    record) fails the whole call: a failure the handler meant must never pass for a success."""
    index: dict[tuple[object, object, object], int] = {
        (r.topic, r.partition, r.offset): i for i, r in enumerate(records)
    }
    outcomes: list[BaseException | None] = [None] * len(records)
    for item in failed.failures:
        record, exc = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
        where = index.get(
            (getattr(record, "topic", None), getattr(record, "partition", None), getattr(record, "offset", None))
        )
        if where is None or not isinstance(exc, BaseException):
            bad = RuntimeError(f"BatchFailed names {item!r:.200}, which is not (a record of this call, an exception)")
            bad.__cause__ = failed
            return [bad] * len(records)
        outcomes[where] = exc
    return outcomes
