"""The runtime under test, as child roles: a `RetryApp` with a benchmark handler, started in this process.

Every role builds the app exactly as a user would (`RetryApp(...)`, `@app.handler`, `app.start`), with the
product's defaults; only the consumer's session timeout is shortened, for the embedded broker's slow join.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from bench.measure import emit
from retrytopics.app import RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.record import Record
from retrytopics.observe.events import Event

__all__ = ["app_failure", "app_share", "app_success", "app_success_batch", "app_tiers", "app_window"]


class _Finish:
    """Counts up to `n`, remembering when the first and the n-th count happened."""

    def __init__(self, n: int) -> None:
        self.n, self.count = n, 0
        self.first = self.last = 0.0
        # this process's CPU time over the same span: a per-record cost that a busy machine does not inflate
        self.cpu_first = self.cpu_last = 0.0
        self.done = threading.Event()

    def tick(self, count: int = 1) -> None:
        """`count` more (a batch handler's call counts its records at once, as the floor does)."""
        reached = self.count < self.n <= self.count + count
        self.count += count
        if not self.first:
            self.first, self.cpu_first = time.monotonic(), time.process_time()
        if reached:
            self.last, self.cpu_last = time.monotonic(), time.process_time()
            self.done.set()

    def report(self, **extra: Any) -> None:
        elapsed = self.last - self.first
        cpu_us = (self.cpu_last - self.cpu_first) * 1e6 / self.n
        emit(
            "done",
            count=self.count,
            seconds=elapsed,
            rate=self.n / elapsed if elapsed else None,
            cpu_us_per_record=cpu_us,
            **extra,
        )


class _Retried:
    """A hook that ticks once per acknowledged republish to a tier."""

    wanted_events = frozenset({Event.RETRY_SCHEDULED})

    def __init__(self, finish: _Finish, started: _Finish) -> None:
        self._finish, self._started = finish, started

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event is Event.RETRY_SCHEDULED:
            if not self._finish.first:
                # time runs from the first handler call
                self._finish.first, self._finish.cpu_first = self._started.first, self._started.cpu_first
            self._finish.tick()


def _app(args: dict[str, Any], **options: Any) -> RetryApp:
    kafka = KafkaConfig(bootstrap=args["bootstrap"])
    return RetryApp(kafka=kafka, group=args["group"], consumer_overrides=args.get("consumer_overrides", {}), **options)


def _serve(app: RetryApp, finish: _Finish, *, main: bool, tiers: str | None, timeout_s: float) -> None:
    app.start(main=main, tiers=tiers)
    emit("ready")
    try:
        if not finish.done.wait(timeout_s):
            raise TimeoutError(f"{finish.count} of {finish.n} records after {timeout_s}s")
    finally:
        app.stop()


def app_success(args: dict[str, Any]) -> None:
    """A no-op handler on `topic`; done after `n` handler calls. Args: bootstrap, topic, group, n."""
    app, finish = _app(args), _Finish(args["n"])

    @app.handler(args["topic"], policy=RetryPolicy(delays=["1h"]))
    def handle(record: Record[bytes]) -> None:
        finish.tick()

    _serve(app, finish, main=True, tiers=None, timeout_s=args.get("timeout_s", 600))
    finish.report()


def app_success_batch(args: dict[str, Any]) -> None:
    """A no-op batch handler on `topic`; done after `n` records handled. Args: bootstrap, topic, group, n."""
    app, finish = _app(args), _Finish(args["n"])

    @app.batch_handler(args["topic"], policy=RetryPolicy(delays=["1h"]))
    def handle(records: list[Record[bytes]]) -> None:
        finish.tick(len(records))

    _serve(app, finish, main=True, tiers=None, timeout_s=args.get("timeout_s", 600))
    finish.report()


def app_failure(args: dict[str, Any]) -> None:
    """Every handler call fails once → republish to the "1h" tier; done after `n` acknowledged republishes."""
    started, finish = _Finish(args["n"]), _Finish(args["n"])
    app = _app(args, hooks=[_Retried(finish, started)])

    @app.handler(args["topic"], policy=RetryPolicy(delays=["1h"]))
    def handle(record: Record[bytes]) -> None:
        started.tick()
        raise RuntimeError("fails once")

    app.provision(partitions=args["partitions"])
    _serve(app, finish, main=True, tiers=None, timeout_s=args.get("timeout_s", 600))
    finish.report()


def app_share(args: dict[str, Any]) -> None:
    """`members` apps in this process, the main consumers of `topic` in one group: share-group members when
    `consumer` is "share" (at most `batch` records a poll), else consumer-group members; a handler that
    sleeps `handler_ms`. Done after `n` distinct records handled; a record handled twice is counted once and
    reported (`duplicates`). Args: bootstrap, topic, group, n, members, consumer, handler_ms, batch."""
    finish, lock = _Finish(args["n"]), threading.Lock()
    seen: set[int] = set()
    calls = 0
    share = args["consumer"] == "share"
    apps: list[RetryApp] = []
    for _ in range(args["members"]):
        app = RetryApp(
            kafka=KafkaConfig(bootstrap=args["bootstrap"]),
            group=args["group"],
            consumer=args["consumer"],
            # librdkafka's consumer-group settings mean nothing to a share consumer
            consumer_overrides={} if share else args.get("consumer_overrides", {}),
            batch_size=args["batch"] if share else 500,
        )

        @app.handler(args["topic"], policy=RetryPolicy(delays=["1h"]))
        def handle(record: Record[bytes]) -> None:
            nonlocal calls
            time.sleep(args["handler_ms"] / 1000)
            with lock:
                calls += 1
                if record.offset not in seen:
                    seen.add(record.offset)
                    finish.tick()

        apps.append(app)
    for app in apps:
        app.start(main=True)
    emit("ready")
    try:
        if not finish.done.wait(args.get("timeout_s", 600)):
            raise TimeoutError(f"{finish.count} of {finish.n} records after the timeout")
    finally:
        for app in apps:
            app.stop()
    finish.report(duplicates=calls - len(seen))


def app_tiers(args: dict[str, Any]) -> None:
    """Tier consumers only, for `topic`'s `delay` tier. Reports "paused" once every partition is paused.

    With `n`, done after n handler calls, reporting each record's lateness (handled_at - retry.due_at, ms);
    without, runs until terminated (backlog and idle scenarios).
    """
    n = args.get("n") or 0
    app, finish = _app(args), _Finish(max(n, 1))
    lateness: list[float] = []

    @app.handler(args["topic"], policy=RetryPolicy(delays=[args["delay"]]))
    def handle(record: Record[bytes]) -> None:
        handled_at = time.time() * 1000
        assert record.retry is not None and record.retry.due_at is not None
        lateness.append(handled_at - record.retry.due_at)
        finish.tick()

    app.start(main=False, tiers="all")
    emit("ready")
    try:
        _report_paused(app, args["partitions"], finish, args.get("timeout_s", 600))
        if n and not finish.done.wait(args.get("timeout_s", 600)):
            raise TimeoutError(f"{finish.count} of {n} records after the timeout")
        if n:
            finish.report(lateness_ms=[round(x, 3) for x in lateness])
        else:
            threading.Event().wait()  # until SIGTERM (KeyboardInterrupt)
    finally:
        app.stop()


def _report_paused(app: RetryApp, partitions: int, finish: _Finish, timeout_s: float) -> None:
    # Polls only until every partition paused or the first record came due: the harness must not spend
    # the measured process's CPU while it works.
    deadline = time.monotonic() + timeout_s
    while app.stats.paused_partitions < partitions:
        if finish.count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {app.stats.paused_partitions} of {partitions} partitions paused")
        time.sleep(0.1)
    emit("paused", paused=app.stats.paused_partitions)


class _SourceFollowers:
    """Counts the records the main consumer hands off as followers (key order) instead of calling them."""

    wanted_events = frozenset({Event.KEY_ORDER_FOLLOWED})

    def __init__(self, topic: str, finish: _Finish, lock: threading.Lock) -> None:
        self.topic, self.finish, self.lock = topic, finish, lock

    def on_event(self, event: Event, data: dict[str, Any]) -> None:
        if data.get("topic") == self.topic:
            with self.lock:
                self.finish.tick()


def app_window(args: dict[str, Any]) -> None:
    """An `async def` handler awaiting `handler_ms`, with `concurrency` calls in flight (its default order: by
    key); a record whose offset % 10 == 3 fails its first attempt (to the 1 s tier, whose consumer runs too).
    Done after `n` first attempts returned (the source pass: a failure is handed to its tier meanwhile). With
    `ordered` (`ordering=KeyOrdering()`), a record the main consumer hands off as a follower counts instead of
    its first attempt (which runs in the tier, after its key's failed record).
    Args: bootstrap, topic, group, n, concurrency, handler_ms, ordered."""
    import asyncio

    from retrytopics import KeyOrdering

    finish, lock = _Finish(args["n"]), threading.Lock()
    ordered = bool(args.get("ordered"))
    app = _app(args, hooks=[_SourceFollowers(args["topic"], finish, lock)] if ordered else [])
    pause_s = args["handler_ms"] / 1000
    main = f"{args['group']}:main"  # the main consumer's threads (its calls' event loop): not a tier's

    @app.handler(
        args["topic"],
        policy=RetryPolicy(delays=["1s"]),
        concurrency=args["concurrency"],
        ordering=KeyOrdering() if ordered else None,
    )
    async def handle(record: Record[bytes]) -> None:
        await asyncio.sleep(pause_s)
        if record.retry is None:
            if not ordered or threading.current_thread().name.startswith(main):
                with lock:
                    finish.tick()
            if record.offset % 10 == 3:
                raise RuntimeError("fails once")

    app.provision(partitions=args["partitions"])
    _serve(app, finish, main=True, tiers="all", timeout_s=args.get("timeout_s", 600))
    finish.report()
