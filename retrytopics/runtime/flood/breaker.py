"""One guarded handler's breaker in this process (`HandlerGuard`), shared by the handler's main consumer and its
tier consumers, which run in threads of their own: every question goes to the pure state machine
(retrytopics/core/flood_guard.py) under one lock, and the changes of state it answers become events, sent
after the lock is let go. Time is the monotonic clock the loops were given (runtime/clock.py).

A failure is counted by the class of its route (`outcome_of`): a route to a tier is what an outage looks like;
running out of attempts (`exhausted`, `timeout`) counts as such and against the dead-letter budget; any other
DLQ route (non-retryable, poison, invalid retry headers, ...) is about the record and never counts.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from retrytopics.core.flood_guard import Admission, FloodBreaker, FloodGuard, GuardState, Outcome, Transition
from retrytopics.core.flood_records import GuardAction, GuardReport
from retrytopics.core.headers import DlqReason
from retrytopics.core.router import Route, RouteKind
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock

__all__ = ["HandlerGuard", "outcome_of"]

log = logging.getLogger("retrytopics.runtime")

_SPARED = frozenset({DlqReason.EXHAUSTED, DlqReason.TIMEOUT})
#: the most records whose deferrals a guard remembers at once
_SPARED_KEPT = 100_000
#: a report's reason is cut to this many characters (an operator's reason is shown with who gave it)
_REASON_KEPT = 200


def outcome_of(route: Route) -> Outcome:
    """How the guard counts a failure routed to `route` (see the module docstring)."""
    if route.kind is RouteKind.TIER:
        return Outcome.RETRYABLE
    return Outcome.EXHAUSTED if route.reason in _SPARED else Outcome.TERMINAL


def _nothing() -> None:
    return None


class HandlerGuard:
    """The breaker of the handler of source topic `handler` (see the module docstring)::

    guard = HandlerGuard("orders", FloodGuard(), emitter=emitter, clock=SYSTEM_CLOCK, rng=random.Random())
    admission = guard.admit("orders.main", ("orders", 0))
    """

    def __init__(self, handler: str, config: FloodGuard, *, emitter: Emitter, clock: Clock, rng: random.Random) -> None:
        self.handler = handler
        self.config = config
        self._breaker = FloodBreaker(config, rng=rng)
        self._lock = threading.Lock()
        self._emitter = emitter
        self._monotonic = clock.monotonic
        #: how many times each record (topic, partition, offset) was spared the DLQ while the guard was not
        #: closed: at most `max_deferrals`; forgotten when the guard closes
        self._spared: dict[tuple[str, int, int], int] = {}
        #: records not dead-lettered because they ran out of attempts while the guard was open
        self.deferred = 0
        #: times the guard opened (a failed probe re-opening it included)
        self.openings = 0
        #: probe calls whose outcome came back
        self.probes = 0
        #: the reason of the last change of state, and its wall-clock time (the process's start before any)
        self.last_change = "started"
        self._wall_ms = clock.now_ms
        self.changed_at_ms = clock.now_ms()
        #: time spent not closed, in the openings that ended
        self._open_ms_ended = 0
        #: called after each change of state, outside the lock (the board writes a report: board.py)
        self.on_change: Callable[[], None] = _nothing

    def _now_ms(self) -> int:
        return int(self._monotonic() * 1000)

    @property
    def state(self) -> GuardState:
        return self._breaker.state

    @property
    def refused(self) -> int:
        """Calls refused since the guard was made."""
        return self._breaker.refused

    @property
    def free(self) -> bool:
        """Closed and past its ramp: every call goes through. Read without the lock: a stale True costs at
        most the rest of one run, which the stage cuts at its first failure once the guard opened."""
        return self._breaker.free

    def refusing(self) -> bool:
        """Whether a call would be refused now (the hold reason's question, once per partition and poll)."""
        with self._lock:
            return self._breaker.refusing(self._now_ms())

    def admit(self, consumer: str, tp: tuple[str, int]) -> Admission:
        """Whether a call on a record of `tp` may go now; one admitted as a probe must be followed by
        `succeeded`/`failed` with `probe=True`, or `cancel_probe`."""
        with self._lock:
            admission = self._breaker.admit(self._now_ms())
        if not admission.call:
            self._emitter.emit(
                Event.FLOOD_GUARD_REFUSED, handler=self.handler, consumer=consumer, topic=tp[0], partition=tp[1]
            )
        return admission

    def wait_ms(self, refused: Admission) -> int:
        """How long until the guard may admit a call, after it refused one (`refused`)."""
        with self._lock:
            return max(1, refused.retry_at_ms - self._now_ms())

    def cancel_probe(self) -> None:
        with self._lock:
            self._breaker.cancel_probe()

    def succeeded(self, count: int, *, probe: bool, consumer: str) -> None:
        """`count` calls returned (a probe is always one)."""
        if not probe:
            if count:
                with self._lock:
                    self._breaker.record_successes(count, self._now_ms())
            return
        with self._lock:
            events = self._recorded(Outcome.SUCCESS, probe=True)
        self._emitter.emit(Event.FLOOD_GUARD_PROBED, handler=self.handler, consumer=consumer, succeeded=True)
        self._send(events)

    def failed(self, route: Route, *, probe: bool, consumer: str, record: tuple[str, int, int]) -> bool:
        """A call on `record` (topic, partition, offset) failed (or it failed before its call: poison, bad retry
        headers), routed to `route`. True when the record ran out of attempts while the guard is not closed,
        and was spared fewer than `max_deferrals` times before: it is not to be dead-lettered."""
        outcome = outcome_of(route)
        counted_probe = probe and outcome is not Outcome.TERMINAL
        with self._lock:
            events = self._recorded(outcome, probe=probe)
            spared = outcome is Outcome.EXHAUSTED and self._breaker.state is not GuardState.CLOSED
            if spared:
                times = self._spared.get(record, 0)
                spared = times < self.config.max_deferrals
                if spared:
                    if len(self._spared) >= _SPARED_KEPT:
                        self._spared.clear()  # a bound, not an LRU: a record forgotten may be spared again
                    self._spared[record] = times + 1
                    self.deferred += 1
        if counted_probe:
            self._emitter.emit(Event.FLOOD_GUARD_PROBED, handler=self.handler, consumer=consumer, succeeded=False)
        self._send(events)
        return spared

    def _recorded(self, outcome: Outcome, *, probe: bool) -> list[tuple[Event, dict[str, object]]]:
        """Count one outcome (under the lock); the events its changes of state make, to send after it."""
        breaker = self._breaker
        opened_at = breaker.opened_at_ms
        transitions = breaker.record(outcome, self._now_ms(), probe=probe)
        if probe and outcome is not Outcome.TERMINAL:
            self.probes += 1
        return self._changed(transitions, opened_at)

    def _changed(self, transitions: list[Transition], opened_at: int | None) -> list[tuple[Event, dict[str, object]]]:
        """The events of `transitions` (under the lock), counted; `opened_at`: when the guard opened before."""
        breaker = self._breaker
        events: list[tuple[Event, dict[str, object]]] = []
        for transition in transitions:
            self.last_change = transition.reason
            self.changed_at_ms = self._wall_ms()
            data: dict[str, object] = {"handler": self.handler, "reason": transition.reason}
            if transition.state is GuardState.OPEN:
                self.openings += 1
                data["backoff_ms"] = 0 if breaker.forced else max(0, breaker.retry_at_ms - transition.at_ms)
                events.append((Event.FLOOD_GUARD_OPENED, data))
            else:
                self._spared.clear()
                open_ms = 0 if opened_at is None else transition.at_ms - opened_at
                self._open_ms_ended += open_ms
                data["open_ms"] = open_ms
                events.append((Event.FLOOD_GUARD_CLOSED, data))
        return events

    def _send(self, events: list[tuple[Event, dict[str, object]]]) -> None:
        for event, data in events:
            self._emitter.emit(event, **data)
        if events:
            self.on_change()

    # -- by hand -------------------------------------------------------------------------------------------------

    def force(self, action: GuardAction, reason: str) -> None:
        """An operator's command (runtime/flood/board.py): open the guard and keep it open until closed by hand,
        or close it (calls ramp up) whatever opened it. Closing a closed guard changes nothing."""
        with self._lock:
            breaker = self._breaker
            opened_at = breaker.opened_at_ms
            if action is GuardAction.OPEN:
                transitions = [breaker.force_open(self._now_ms(), reason)]
            elif breaker.state is GuardState.CLOSED:
                transitions = []
            else:
                transitions = [breaker.force_close(self._now_ms(), reason)]
            events = self._changed(transitions, opened_at)
        log.warning(
            "flood guard of %s %s by hand: %s",
            self.handler,
            "opened" if action is GuardAction.OPEN else ("closed" if events else "left closed"),
            reason,
        )
        self._send(events)

    def report(self, *, process: str, at_ms: int) -> GuardReport:
        """What the guard says of itself now, as `process` at `at_ms` (wall clock)."""
        reason = self.last_change
        if len(reason) > _REASON_KEPT:
            reason = reason[: _REASON_KEPT - 1] + "…"
        with self._lock:
            breaker = self._breaker
            opened_at = breaker.opened_at_ms
            open_now = 0 if opened_at is None else max(0, self._now_ms() - opened_at)
            return GuardReport(
                handler=self.handler,
                process=process,
                state=breaker.state,
                forced=breaker.forced,
                reason=reason,
                at_ms=at_ms,
                changed_at_ms=self.changed_at_ms,
                openings=self.openings,
                probes=self.probes,
                refused=breaker.refused,
                deferred=self.deferred,
                open_ms=self._open_ms_ended + open_now,
            )
