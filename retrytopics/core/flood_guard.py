"""The retry-flood guard's rules: tell a dependency's outage from a bad record, and say when calls may go on.

Pure: standard library only; the time is an argument (`now_ms`) and the jitter comes from the `random.Random`
the caller passes. A `FloodBreaker` is one handler's state machine, fed the class of each call's outcome; the
runtime asks it before a call and carries out what it answers (holding partitions, probing). Nothing here
pauses, publishes or sleeps.

The rules, as the guarantee:

- **Only retryable failures count.** A non-retryable failure, a poison record or a record with bad retry
  headers goes where it goes and tells nothing of the dependency (`Outcome.TERMINAL`). A bad record among
  successes cannot open the guard: it opens on a *ratio* of the calls in the window, with a minimum count.
- **It opens** when, over the last `window`, at least `min_calls` calls were made and at least
  `failure_ratio` of them failed retryably; or when more than `dead_letters_per_minute` records ran out of
  attempts in the last minute (the dead-letter budget; off when None).
- **Open**: no call is admitted until the back-off has passed (`backoff`, doubling on each failed probe up to
  `max_backoff`, with +/- `jitter`).
- **Half-open**: `probes` calls are admitted, one after another's outcome; a retryable failure of any re-opens
  it with a longer back-off, `probes` successes close it.
- **Closing ramps**: for `ramp` after closing, calls are admitted at `ramp_start` a second, the rate doubling
  ten times over `ramp`; then without a limit. A dependency that just came back is not hit with everything at
  once, and a failure ratio reached while ramping opens the guard again.
- **Opened by hand** (`force_open`) it stays open until closed by hand (`force_close`), which starts the ramp.

Why a failure ratio and not a retry budget of its own: in an outage every call fails, so the ratio is at its
top at once; a budget on retries alone would also trip while tiers drain a backlog that now succeeds.
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from dataclasses import dataclass

from retrytopics.core.durations import DurationLike, parse_duration
from retrytopics.core.errors import ConfigError

__all__ = ["Admission", "FloodBreaker", "FloodGuard", "GuardState", "Outcome", "Transition"]

#: the window is counted in this many buckets: a call leaves the count at most window/_BUCKETS late
_BUCKETS = 10
#: the ramp doubles the admitted rate this many times before it lets everything through
_RAMP_DOUBLINGS = 10
_DEAD_LETTER_SPAN_MS = 60_000


@dataclass(frozen=True, slots=True, kw_only=True)
class FloodGuard:
    """A handler's retry-flood guard: stop calling a dependency that is down instead of draining the source
    into the DLQ. The defaults open on half the calls of 10 s failing (with at least 20 calls) and probe
    after 1 s, then 2 s, 4 s ... up to a minute::

        FloodGuard(failure_ratio=0.5, min_calls=20, window="10s", backoff="1s", max_backoff="1m")

    Too low a `min_calls` lets a handful of bad records open it on a quiet topic; too high a `failure_ratio`
    lets an outage that fails only part of the calls (one of two database replicas) through.

    A record that runs out of attempts while the guard is not closed is not dead-lettered, at most
    `max_deferrals` times (then it goes to the DLQ as ever): a bad record alone on a quiet pipeline would
    otherwise be every probe, fail it, and keep the guard open for good.
    """

    failure_ratio: float = 0.5
    min_calls: int = 20
    window: DurationLike = "10s"
    dead_letters_per_minute: int | None = None
    backoff: DurationLike = "1s"
    max_backoff: DurationLike = "1m"
    jitter: float = 0.2
    probes: int = 1
    ramp: DurationLike = "10s"
    ramp_start: float = 5.0
    max_deferrals: int = 5

    def __post_init__(self) -> None:
        _ratio("failure_ratio", self.failure_ratio, low_open=True)
        _ratio("jitter", self.jitter, low_open=False, high=0.9)
        _count("min_calls", self.min_calls, 1, 1_000_000)
        _count("probes", self.probes, 1, 1_000)
        _count("max_deferrals", self.max_deferrals, 1, 1_000)
        if self.dead_letters_per_minute is not None:
            _count("dead_letters_per_minute", self.dead_letters_per_minute, 0, 1_000_000)
        if self.window_ms < _BUCKETS:
            raise ConfigError("window", self.window, f"expected at least {_BUCKETS}ms")
        if self.backoff_ms <= 0:
            raise ConfigError("backoff", self.backoff, "expected a back-off above 0")
        if self.max_backoff_ms < self.backoff_ms:
            raise ConfigError("max_backoff", self.max_backoff, f"must be at least backoff ({self.backoff!r})")
        parse_duration(self.ramp, field="ramp")
        start = self.ramp_start
        if isinstance(start, bool) or not isinstance(start, int | float) or not (0 < start < math.inf):
            raise ConfigError("ramp_start", start, "expected a finite number of calls a second above 0")

    @property
    def window_ms(self) -> int:
        return parse_duration(self.window, field="window")

    @property
    def backoff_ms(self) -> int:
        return parse_duration(self.backoff, field="backoff")

    @property
    def max_backoff_ms(self) -> int:
        return parse_duration(self.max_backoff, field="max_backoff")

    @property
    def ramp_ms(self) -> int:
        return parse_duration(self.ramp, field="ramp")


class Outcome(enum.StrEnum):
    """The class of one call's outcome, as the guard counts it."""

    SUCCESS = "success"
    """The handler returned."""
    RETRYABLE = "retryable"
    """The handler failed and the record is to be retried: what a dependency's outage looks like."""
    TERMINAL = "terminal"
    """Non-retryable, poison, bad retry headers: about the record, never counted."""
    EXHAUSTED = "exhausted"
    """A retryable failure on a record's last attempt: counted as RETRYABLE and against the dead-letter
    budget."""


class GuardState(enum.StrEnum):
    """Where a guard stands."""

    CLOSED = "closed"
    """Calls go through (at a ramped rate for a while after closing)."""
    OPEN = "open"
    """No call goes through until the back-off has passed."""
    HALF_OPEN = "half_open"
    """Probe calls go through, one at a time."""


@dataclass(frozen=True, slots=True)
class Admission:
    """What a guard answers before a call: `call` now (as a `probe` when half-open), or not before `retry_at_ms`."""

    call: bool
    probe: bool = False
    retry_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of state, for events and metrics: `reason` says why (`failure_ratio`, `dead_letters`,
    `probe_failed`, `probe_succeeded`, `backoff_passed`, or the operator's text for a forced change)."""

    state: GuardState
    at_ms: int
    reason: str


_GO = Admission(call=True)


class FloodBreaker:
    """One handler's guard state (see the module docstring)::

    breaker = FloodBreaker(FloodGuard(), rng=random.Random(7))
    admission = breaker.admit(now_ms)
    if admission.call:
        transitions = breaker.record(outcome, now_ms, probe=admission.probe)
    """

    def __init__(self, guard: FloodGuard, *, rng: random.Random) -> None:
        self.guard = guard
        self._rng = rng
        self._bucket_ms = max(1, guard.window_ms // _BUCKETS)
        self._calls: deque[tuple[int, int, int]] = deque()  # (bucket index, calls, retryable failures)
        self._dead_letters: deque[int] = deque()
        self.state = GuardState.CLOSED
        self.forced = False
        self.opened_at_ms: int | None = None
        self._backoff_ms = 0
        self._retry_at_ms = 0
        self._probes_passed = 0
        self._probe_out = False
        self._closed_at_ms: int | None = None
        self._ramp_tokens = 0.0
        self._ramp_seen_ms = 0
        self._ramp_refused_until_ms = 0
        #: calls refused since the breaker was made: the calls an outage did not get
        self.refused = 0

    # -- asked before a call ---------------------------------------------------------------------------------

    @property
    def free(self) -> bool:
        """Closed and past the ramp: every call is admitted, and `admit` changes nothing."""
        return self.state is GuardState.CLOSED and self._closed_at_ms is None

    @property
    def retry_at_ms(self) -> int:
        """When an open guard admits its next probe (meaningless when closed)."""
        return self._retry_at_ms

    def refusing(self, now_ms: int) -> bool:
        """Whether `admit(now_ms)` would refuse, asked without changing anything (a consumer holds the
        partitions of a guarded handler while it does): open before its back-off passed (or opened by hand),
        half-open with a probe out, or ramping until the refused call's time."""
        if self.state is GuardState.OPEN:
            return self.forced or now_ms < self._retry_at_ms
        if self.state is GuardState.HALF_OPEN:
            return self._probe_out
        return self._closed_at_ms is not None and now_ms < self._ramp_refused_until_ms

    def admit(self, now_ms: int) -> Admission:
        """Whether a call may go now. An answer with `call=True` must be followed by `record` of its
        outcome (with `probe` as answered) or `cancel_probe`."""
        if self.state is GuardState.CLOSED:
            return _GO if self._closed_at_ms is None else self._ramped(now_ms)
        if self.state is GuardState.OPEN:
            if self.forced or now_ms < self._retry_at_ms:
                self.refused += 1
                return Admission(call=False, retry_at_ms=self._retry_at_ms if not self.forced else now_ms + 1_000)
            self.state = GuardState.HALF_OPEN
            self._probes_passed = 0
        if self._probe_out:
            self.refused += 1
            return Admission(call=False, retry_at_ms=now_ms + self._bucket_ms)
        self._probe_out = True
        return Admission(call=True, probe=True)

    def cancel_probe(self) -> None:
        """A probe that was admitted but not called (its record went elsewhere): the next call may probe."""
        self._probe_out = False

    def _ramped(self, now_ms: int) -> Admission:
        assert self._closed_at_ms is not None
        guard = self.guard
        elapsed = now_ms - self._closed_at_ms
        if elapsed >= guard.ramp_ms:
            self._closed_at_ms = None
            self._backoff_ms = 0  # recovered: the next outage starts from the first back-off
            return _GO
        rate = guard.ramp_start * 2 ** (_RAMP_DOUBLINGS * elapsed / max(1, guard.ramp_ms))
        self._ramp_tokens = min(max(1.0, rate), self._ramp_tokens + rate * max(0, now_ms - self._ramp_seen_ms) / 1000)
        self._ramp_seen_ms = now_ms
        if self._ramp_tokens >= 1.0:
            self._ramp_tokens -= 1.0
            return _GO
        self.refused += 1
        retry_at = now_ms + max(1, math.ceil((1.0 - self._ramp_tokens) * 1000 / rate))
        self._ramp_refused_until_ms = retry_at
        return Admission(call=False, retry_at_ms=retry_at)

    # -- told after a call -----------------------------------------------------------------------------------

    def record(self, outcome: Outcome, now_ms: int, *, probe: bool = False) -> list[Transition]:
        """Count one call's outcome; the changes of state it made, in order."""
        if outcome is Outcome.TERMINAL:
            if probe:
                self._probe_out = False
            return []
        failed = outcome is not Outcome.SUCCESS
        if probe:
            return self._probed(failed, now_ms)
        self._count(now_ms, failed)
        if outcome is Outcome.EXHAUSTED:
            self._dead_letters.append(now_ms)
        if self.state is not GuardState.CLOSED:
            return []  # a call admitted before the guard opened
        reason = self._tripped(now_ms)
        # opened again while ramping: the dependency had not recovered, so the back-off goes on growing
        return [] if reason is None else [self._open(now_ms, reason, longer=self._closed_at_ms is not None)]

    def record_successes(self, count: int, now_ms: int) -> list[Transition]:
        """Count `count` calls that returned, none of them a probe: one step for a run of successes."""
        if count <= 0:
            return []
        bucket = now_ms // self._bucket_ms
        calls = self._calls
        if calls and calls[-1][0] == bucket:
            _, n, f = calls[-1]
            calls[-1] = (bucket, n + count, f)
        else:
            calls.append((bucket, count, 0))
        return []

    def _probed(self, failed: bool, now_ms: int) -> list[Transition]:
        self._probe_out = False
        if self.state is not GuardState.HALF_OPEN:
            return []
        if failed:
            return [self._open(now_ms, "probe_failed", longer=True)]
        self._probes_passed += 1
        if self._probes_passed < self.guard.probes:
            return []
        return [self._close(now_ms, "probe_succeeded")]

    def _count(self, now_ms: int, failed: bool) -> None:
        bucket = now_ms // self._bucket_ms
        calls = self._calls
        if calls and calls[-1][0] == bucket:
            _, n, f = calls[-1]
            calls[-1] = (bucket, n + 1, f + failed)
        else:
            calls.append((bucket, 1, int(failed)))

    def _tripped(self, now_ms: int) -> str | None:
        guard, calls = self.guard, self._calls
        oldest = now_ms // self._bucket_ms - _BUCKETS + 1
        while calls and calls[0][0] < oldest:
            calls.popleft()
        total = sum(n for _, n, _ in calls)
        if total >= guard.min_calls and sum(f for _, _, f in calls) >= guard.failure_ratio * total:
            return "failure_ratio"
        budget, dead = guard.dead_letters_per_minute, self._dead_letters
        if budget is not None:
            while dead and dead[0] <= now_ms - _DEAD_LETTER_SPAN_MS:
                dead.popleft()
            if len(dead) > budget:
                return "dead_letters"
        return None

    # -- state changes ---------------------------------------------------------------------------------------

    def _open(self, now_ms: int, reason: str, *, longer: bool) -> Transition:
        guard = self.guard
        grown = min(guard.max_backoff_ms, max(guard.backoff_ms, self._backoff_ms * 2))
        self._backoff_ms = grown if longer else guard.backoff_ms
        spread = self._backoff_ms * guard.jitter
        self._retry_at_ms = now_ms + max(1, round(self._backoff_ms + self._rng.uniform(-spread, spread)))
        if self.state is GuardState.CLOSED:
            self.opened_at_ms = now_ms
        self.state = GuardState.OPEN
        self._closed_at_ms = None
        self._calls.clear()
        self._dead_letters.clear()
        return Transition(GuardState.OPEN, now_ms, reason)

    def _close(self, now_ms: int, reason: str) -> Transition:
        self.state = GuardState.CLOSED
        self.forced = False
        self.opened_at_ms = None
        self._probe_out = False
        self._calls.clear()
        self._closed_at_ms = now_ms if self.guard.ramp_ms > 0 else None
        if self._closed_at_ms is None:
            self._backoff_ms = 0
        self._ramp_tokens = 1.0
        self._ramp_seen_ms = now_ms
        return Transition(GuardState.CLOSED, now_ms, reason)

    def force_open(self, now_ms: int, reason: str) -> Transition:
        """An operator opened the guard: it stays open, probing nothing, until `force_close`."""
        transition = self._open(now_ms, reason, longer=False)
        self.forced = True
        return transition

    def force_close(self, now_ms: int, reason: str) -> Transition:
        """An operator closed the guard: calls go on, ramped."""
        return self._close(now_ms, reason)


def _ratio(field: str, value: float, *, low_open: bool, high: float = 1.0) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or not ((0 < value) if low_open else (0 <= value)) or value > high:
        bounds = f"{'(0' if low_open else '[0'}, {high}]"
        raise ConfigError(field, value, f"expected a number in {bounds}")


def _count(field: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(field, value, f"expected an int in {low}..{high}")
