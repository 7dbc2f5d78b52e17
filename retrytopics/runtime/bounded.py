"""Client calls that must not block a consumer loop past a bound.

librdkafka is given a timeout for each blocking call, but does not always keep it (a transactional producer's
`send_offsets_to_transaction` stayed blocked for minutes after its group coordinator's broker died). So the
call runs in a worker thread, and the loop waits for it at most `timeout_s`: a call still running then is
*abandoned*. Its thread is left to finish on its own, or never (a daemon: it keeps no process alive), and the
next call gets a fresh thread; the caller replaces the client the abandoned call was using.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.ports import ConsumerPort, Message, PartitionsCallback, Polled, TopicPartition, consume_runs
from retrytopics.runtime.clock import SYSTEM_CLOCK

log = logging.getLogger("retrytopics.runtime")

__all__ = ["BoundedCalls", "BoundedCommits", "CallAbandoned"]

T = TypeVar("T")


class CallAbandoned(KafkaClientError):
    """A client call outlived its bound and was left running in its thread; what it did is unknown."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(f"{what} did not return within {timeout_s:g} s; abandoned", code="_ABANDONED", retriable=True)


class _Call:
    __slots__ = ("args", "done", "error", "fn", "result")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _Worker:
    """One daemon thread running calls in turn."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, call: _Call) -> None:
        self._calls.put(call)

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            try:
                call.result = call.fn(*call.args)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller, raised there
                call.error = exc
            finally:
                call.done.set()


class BoundedCalls:
    """Runs blocking client calls for one consumer loop, each for at most `timeout_s` (module docstring)."""

    def __init__(self, *, timeout_s: float, name: str, monotonic: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> None:
        self.timeout_s = timeout_s
        self._name = name
        self.monotonic = monotonic
        self._worker: _Worker | None = None
        #: when the call in progress started (on `monotonic`), None between calls; read by health checks
        self.started_at: float | None = None
        self._abandoned: list[_Call] = []

    def call(self, what: str, fn: Callable[..., T], *args: Any, bound_s: float | None = None) -> T:
        """`fn(*args)` in the worker thread: its result, or its exception; `CallAbandoned` once `bound_s`
        (default `timeout_s`) passed without either."""
        bound = self.timeout_s if bound_s is None else bound_s
        worker = self._worker
        if worker is None:
            worker = self._worker = _Worker(f"{self._name}:client-calls")
        call = _Call(fn, args)
        self.started_at = self.monotonic()
        try:
            worker.submit(call)
            finished = call.done.wait(bound)
        finally:
            self.started_at = None
        if not finished:
            self._worker = None  # busy for good, maybe: the next call gets a thread of its own
            self._abandoned.append(call)
            raise CallAbandoned(what, bound)
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[no-any-return]

    def still_abandoned(self) -> bool:
        """Whether a call abandoned earlier is still running in its thread."""
        self._abandoned = [call for call in self._abandoned if not call.done.is_set()]
        return bool(self._abandoned)

    def running_for(self) -> float:
        """How long the call in progress has run (0.0 between calls)."""
        started = self.started_at
        return 0.0 if started is None else self.monotonic() - started


class BoundedCommits:
    """A consumer whose synchronous commits wait at most `calls.timeout_s`: librdkafka's wait has no bound
    (with the broker frozen, one was still blocked after 90 s). An abandoned commit raises `CallAbandoned`,
    and its offsets count as not committed. A consumer with an abandoned commit still running is not closed
    (that thread is inside it): its group membership lapses by the session timeout instead."""

    def __init__(self, consumer: ConsumerPort, calls: BoundedCalls) -> None:
        self._consumer = consumer
        self._calls = calls
        # read by runtime/records/ownership.py
        self.max_poll_interval_ms: int = getattr(consumer, "max_poll_interval_ms", 300_000)
        self.session_timeout_ms: int = getattr(consumer, "session_timeout_ms", 45_000)

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        self._consumer.subscribe(topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        return self._consumer.consume(max_records, timeout_s)

    def consume_runs(self, max_records: int, timeout_s: float, topics: frozenset[str]) -> Polled:
        return consume_runs(self._consumer, max_records, timeout_s, topics)

    def pause(self, tps: Sequence[TopicPartition]) -> None:
        self._consumer.pause(tps)

    def resume(self, tps: Sequence[TopicPartition]) -> None:
        self._consumer.resume(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._consumer.seek(tp, offset)

    def commit(self, offsets: Mapping[TopicPartition, int], *, asynchronous: bool) -> None:
        if asynchronous:
            self._consumer.commit(offsets, asynchronous=True)
            return
        self._calls.call("a synchronous commit", self._commit_now, dict(offsets))

    def _commit_now(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._consumer.commit(offsets, asynchronous=False)

    def positions(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return self._consumer.positions(tps)

    def failed_commits(self) -> dict[TopicPartition, int]:
        return self._consumer.failed_commits()

    def committed_metadata(self, tps: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, str]:
        return self._consumer.committed_metadata(tps, timeout_s)

    def mark_commits(self, marks: Mapping[TopicPartition, str]) -> None:
        self._consumer.mark_commits(marks)

    def group_metadata(self) -> object:
        return self._consumer.group_metadata()

    def close(self) -> None:
        if self._calls.still_abandoned():
            log.warning(
                "not closing a consumer with a commit still stuck in it; its membership lapses by the session timeout"
            )
            return
        self._consumer.close()
