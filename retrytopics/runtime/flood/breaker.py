"""One guarded handler's breaker in this process (`HandlerGuard`), shared by the handler's main consumer and its
tier consumers, which run in threads of their own: every question goes to the pure state machine
(retrytopics/core/flood_guard.py) under one lock, and the changes of state it answers become events, sent
after the lock is let go. Time is the monotonic clock the loops were given (runtime/clock.py).

A failure is counted by the class of its route (`outcome_of`): a route to a tier is what an outage looks like;
running out of attempts (`exhausted`, `timeout`) counts as such and against the dead-letter budget; any other
DLQ route (non-retryable, poison, invalid retry headers, ...) is about the record and never counts.
"""

from __future__ import annotations

import random
import threading

from retrytopics.core.flood_guard import Admission, FloodBreaker, FloodGuard, GuardState, Outcome
from retrytopics.core.headers import DlqReason
from retrytopics.core.router import Route, RouteKind
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.clock import Clock

__all__ = ["HandlerGuard", "outcome_of"]

_SPARED = frozenset({DlqReason.EXHAUSTED, DlqReason.TIMEOUT})
#: the most records whose deferrals a guard remembers at once
_SPARED_KEPT = 100_000


def outcome_of(route: Route) -> Outcome:
    """How the guard counts a failure routed to `route` (see the module docstring)."""
    if route.kind is RouteKind.TIER:
        return Outcome.RETRYABLE
    return Outcome.EXHAUSTED if route.reason in _SPARED else Outcome.TERMINAL


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
        events: list[tuple[Event, dict[str, object]]] = []
        for transition in transitions:
            data: dict[str, object] = {"handler": self.handler, "reason": transition.reason}
            if transition.state is GuardState.OPEN:
                self.openings += 1
                data["backoff_ms"] = max(0, breaker.retry_at_ms - transition.at_ms)
                events.append((Event.FLOOD_GUARD_OPENED, data))
            else:
                self._spared.clear()
                data["open_ms"] = 0 if opened_at is None else transition.at_ms - opened_at
                events.append((Event.FLOOD_GUARD_CLOSED, data))
        return events

    def _send(self, events: list[tuple[Event, dict[str, object]]]) -> None:
        for event, data in events:
            self._emitter.emit(event, **data)
