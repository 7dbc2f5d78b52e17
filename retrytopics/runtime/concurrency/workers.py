"""Where a window's calls run: an `async def` handler's as tasks on one event loop in a thread of its own, a
plain handler's on a bounded thread pool. Each call's failure (None: it returned) comes back as a value on one
queue the consumer's thread reads (`done`); nothing here touches a record's offset or its route.

`policy.in_process` retries run inside the call, as on the consumer's thread (runtime/records/calls.py), with
the same rule: only failures the policy calls retryable, waits cut short when the app stops.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from retrytopics.core.classify import Verdict, classify
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.record import Record

__all__ = ["Workers", "is_async_handler"]

#: a call's token and its failure (None: returned), as the workers hand it back
Done = tuple[object, BaseException | None]


def is_async_handler(handler: Callable[..., Any]) -> bool:
    """Whether `handler` is an `async def` function (or an object whose `__call__` is)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__)


class Workers:
    """Runs one consumer's windowed calls (see the module docstring); `threads` bounds the pool of plain
    handlers' calls. Made idle: the pool and the event loop start with their first call."""

    def __init__(self, *, threads: int, stop: threading.Event, name: str) -> None:
        self._threads = threads
        self._stop = stop
        self._name = name
        #: the plain handlers' calls to run, and the threads that run them (daemons: a call that never returns
        #: must not keep the process from exiting once the app stopped)
        self._calls: queue.SimpleQueue[tuple[object, Callable[[Record[Any]], Any], Record[Any], RetryPolicy] | None]
        self._calls = queue.SimpleQueue()
        self._pool: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call
        self._queued = 0  # calls put and not taken yet
        self._idle_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        #: the calls that returned, in the order they did
        self.done: queue.SimpleQueue[Done] = queue.SimpleQueue()
        #: set when a call returned while `waiting` (the consumer's thread waits on it while its window is full)
        self.returned = threading.Event()
        self.waiting = False
        #: `async def` calls started since the last `flush`, handed to the event loop together
        self._pending: list[Coroutine[Any, Any, None]] = []
        #: per handler (by identity), whether it is an `async def` one: asked once, not per call
        self._asynchronous: dict[int, bool] = {}

    def start(
        self, token: object, handler: Callable[[Record[Any]], Any], record: Record[Any], policy: RetryPolicy
    ) -> None:
        """Start one call of `handler` on `record` (an `async def` one at the next `flush`); its outcome comes
        back on `done` with `token`."""
        asynchronous = self._asynchronous.get(id(handler))
        if asynchronous is None:
            asynchronous = self._asynchronous[id(handler)] = is_async_handler(handler)
        if asynchronous:
            self._pending.append(self._async_call(token, handler, record, policy))
        else:
            with self._idle_lock:
                self._queued += 1
                short = self._queued > self._idle
            self._calls.put((token, handler, record, policy))
            if short and len(self._pool) < self._threads:
                self._add_thread()

    def flush(self) -> None:
        """Hand the `async def` calls started since the last flush to the event loop, in one wake-up of it."""
        if self._pending:
            loop = self._event_loop()
            pending, self._pending = self._pending, []
            loop.call_soon_threadsafe(_spawn, loop, pending)

    def close(self) -> None:
        """Stop taking calls; calls still running are left to end by themselves (their outcomes are dropped)."""
        for _ in self._pool:
            self._calls.put(None)
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            assert self._loop_thread is not None
            self._loop_thread.join(timeout=1.0)

    # -- the calls ---------------------------------------------------------------------------------------------

    def _add_thread(self) -> None:
        thread = threading.Thread(target=self._serve, name=f"{self._name}:call-{len(self._pool)}", daemon=True)
        self._pool.append(thread)
        with self._idle_lock:
            self._idle += 1
        thread.start()

    def _serve(self) -> None:
        calls, lock = self._calls, self._idle_lock
        while True:
            call = calls.get()
            if call is None:
                return
            with lock:
                self._idle -= 1
                self._queued -= 1
            self._sync_call(*call)
            with lock:
                self._idle += 1

    def _sync_call(
        self, token: object, handler: Callable[[Record[Any]], Any], record: Record[Any], policy: RetryPolicy
    ) -> None:
        failure: BaseException | None = None
        in_process = policy.in_process
        attempts = 1 if in_process is None else in_process.attempts
        for attempt in range(1, attempts + 1):
            try:
                result = handler(record)
                if result is not None and inspect.isawaitable(result):  # a plain function returning an awaitable
                    asyncio.run_coroutine_threadsafe(_awaited(result), self._event_loop()).result()
                failure = None
                break
            except BaseException as exc:  # noqa: BLE001 - handed back as a value; BaseException stops the app there
                failure = exc
                if not _retried(policy, exc, attempt, attempts):
                    break
                assert in_process is not None
                if self._stop.wait(in_process.wait_ms / 1000):
                    break
        self._returned(token, failure)

    async def _async_call(
        self, token: object, handler: Callable[[Record[Any]], Any], record: Record[Any], policy: RetryPolicy
    ) -> None:
        failure: BaseException | None = None
        in_process = policy.in_process
        attempts = 1 if in_process is None else in_process.attempts
        for attempt in range(1, attempts + 1):
            try:
                await handler(record)
                failure = None
                break
            except BaseException as exc:  # noqa: BLE001 - handed back as a value; BaseException stops the app there
                failure = exc
                if not _retried(policy, exc, attempt, attempts) or self._stop.is_set():
                    break
                assert in_process is not None
                await asyncio.sleep(in_process.wait_ms / 1000)
        self._returned(token, failure)

    def _returned(self, token: object, failure: BaseException | None) -> None:
        self.done.put((token, failure))
        if self.waiting:
            self.returned.set()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=loop.run_forever, name=f"{self._name}:tasks", daemon=True)
            self._loop_thread.start()
        return loop


#: the running tasks, kept so that none is collected before it ends (asyncio keeps only weak references)
_TASKS: set[asyncio.Task[None]] = set()


def _spawn(loop: asyncio.AbstractEventLoop, calls: list[Coroutine[Any, Any, None]]) -> None:
    for call in calls:
        task = loop.create_task(call)
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _retried(policy: RetryPolicy, exc: BaseException, attempt: int, attempts: int) -> bool:
    """Whether a call that raised `exc` on attempt `attempt` is tried again in-process."""
    return attempt < attempts and isinstance(exc, Exception) and classify(policy, exc).verdict is Verdict.RETRYABLE
