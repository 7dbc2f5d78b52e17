"""What every consumer loop does around its iterations, whatever its consumer model: start the clients inside
the crash handling, iterate until the stop event is set, stop the whole app on a crash, and always shut down
(drain, commit or acknowledge, close); and the watchdog's question whether a handler call has run past its
bound. `ConsumerLoop` (partitions, runtime/consumer/loop.py) and
`ShareConsumerLoop` (a share group, runtime/consumer/share_loop.py) fill in the steps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from retrytopics.core.errors import KafkaClientError
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.consumer.settings import LoopSettings
from retrytopics.runtime.records.calls import Invoker
from retrytopics.runtime.records.ownership import OwnershipGuard

__all__ = ["LoopRun"]

log = logging.getLogger("retrytopics.runtime")


class LoopRun:
    """`run()` for a consumer loop; a subclass provides `_start`, `_crashed`, `_drain` and `_close`."""

    def __init__(self, settings: LoopSettings, emitter: Emitter, stop: threading.Event) -> None:
        self.settings = settings
        self._emitter = emitter
        self._stop = stop
        self._invoker = Invoker(stop)  # calls the handlers (runtime/records/calls.py)
        self.crash: BaseException | None = None
        self.running = False
        #: made by `_start`: judges the current batch's handler call against its bound
        self._guard: OwnershipGuard | None = None

    def _overdue(self) -> bool:
        """Whether the current batch's handler call has run past its bound (`max.poll.interval.ms`, or a share
        group's record lock)."""
        return self.running and self._guard is not None and self._guard.overdue_s() > 0

    def watch(self) -> None:
        """Called by a watchdog thread (runtime/consumer/lifecycle.py): count the record of a handler call past
        its bound as abandoned when it is found, not when (if ever) the call returns."""
        guard = self._guard
        if guard is not None and not guard.overdue_reported and self._overdue():
            guard.report_overdue(self._invoker.calling)

    def _start(self) -> Callable[[], None]:
        """Create the clients and the parts that act through them; returns one iteration of the loop."""
        raise NotImplementedError

    def _crashed(self, cause: BaseException) -> None:
        """The loop is stopping on `cause` (before `_shutdown`)."""
        raise NotImplementedError

    def _drain(self) -> None:
        """Settle what the hand-off holds and commit it (at shutdown)."""
        raise NotImplementedError

    def _close(self) -> None:
        """Close the consumer, if it was made."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        try:
            self._drain()
        except BaseException:
            log.exception("%s: error while draining", self.settings.name)
        finally:
            try:
                self._close()
            except KafkaClientError as exc:
                log.warning("%s: close failed: %s", self.settings.name, exc)
            self._invoker.close()
            self.running = False
            self._emit(Event.CONSUMER_STOPPED, group=self.settings.group_id)

    def run(self) -> None:
        """Iterate until `stop` is set or a handler raises a BaseException; then shut down.

        Creating the clients is inside the crash handling: a client that cannot be created (bad settings, a
        transactional producer whose broker never answers) stops the app with `crash` set, rather than ending
        this thread silently while the app reports itself running and healthy."""
        self.running = True
        try:
            run_once = self._start()
            self._emit(
                Event.CONSUMER_STARTED,
                group=self.settings.group_id,
                topics=list(self.settings.topics),
                tier_topics=self._tier_topics(),
            )
            while not self._stop.is_set():
                run_once()
        except BaseException as exc:
            self.crash = exc
            if isinstance(exc, Exception):
                log.error("%s: stopping the app after an unexpected error", self.settings.name, exc_info=exc)
            else:
                log.warning("%s: stopping the app: %s raised in a handler", self.settings.name, type(exc).__name__)
            self._stop.set()
            self._crashed(exc)
        finally:
            self._shutdown()

    def _tier_topics(self) -> list[str]:
        """The tier topics among those consumed (a handler's retries, not its first attempts)."""
        return []

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self.settings.name, **data)
