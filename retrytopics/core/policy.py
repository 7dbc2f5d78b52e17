"""The retry policy: delay tiers, attempts, timeout, jitter and exception classification, validated at construction.

Pure: standard library only. A policy is an immutable value; nothing here reads a clock or touches Kafka::

    policy = RetryPolicy(delays=["5s", "30s", "5m"], max_retries=5, timeout="6h", jitter=0.1,
                         non_retryable=(ValueError,),
                         per_exception={RateLimited: Exponential(initial="1m", max_delay="30m", tiers=4)})
    policy.tier_delays_ms   # (5000, 30000, 60000, 120000, 240000, 300000, 480000): one topic each

Every invalid value raises :class:`~retrytopics.errors.ConfigError` naming the field (``delays[2]``, ``jitter``,
``per_exception[TimeoutError]``...). docs/policy.md compares each knob with ActiveMQ, Artemis, RocketMQ and Spring.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias

from retrytopics.core.durations import DurationLike, parse_duration
from retrytopics.core.errors import ConfigError

__all__ = [
    "MAX_TIERS",
    "ROCKETMQ_LEVELS",
    "UNLIMITED",
    "Exponential",
    "InProcessRetry",
    "RetryPolicy",
    "Schedule",
]

#: RocketMQ's 18 broker delay levels (``messageDelayLevel``), in order.
ROCKETMQ_LEVELS: Final[tuple[str, ...]] = tuple("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h".split())
#: ``max_retries=UNLIMITED``: the last tier of the schedule repeats until ``timeout`` (if any).
UNLIMITED: Final = "unlimited"
#: Upper bound on distinct tier delays (one topic each) and on the length of one schedule.
MAX_TIERS: Final = 100
_MAX_RETRIES_BOUND: Final = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Exponential:
    """An ActiveMQ/Artemis-style ladder: ``initial * multiplier**i``, capped at ``max_delay``, ``tiers`` steps.

    Steps that hit the cap repeat the same delay and therefore reuse one topic::

        Exponential(initial="1s", multiplier=2.0, max_delay="10s", tiers=6).delays_ms()
        # (1000, 2000, 4000, 8000, 10000, 10000)
    """

    initial: DurationLike
    multiplier: float = 2.0
    max_delay: DurationLike
    tiers: int

    def __post_init__(self) -> None:
        initial = parse_duration(self.initial, field="initial")
        if initial <= 0:
            raise ConfigError("initial", self.initial, "an exponential schedule needs an initial delay above 0")
        if parse_duration(self.max_delay, field="max_delay") < initial:
            raise ConfigError("max_delay", self.max_delay, f"must be at least initial ({self.initial!r})")
        multiplier = self.multiplier
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float) or not math.isfinite(multiplier):
            raise ConfigError("multiplier", multiplier, "expected a finite number >= 1.0")
        if not 1.0 <= multiplier <= 100.0:
            raise ConfigError("multiplier", multiplier, "expected 1.0..100.0 (1.0 is a fixed back-off)")
        if isinstance(self.tiers, bool) or not isinstance(self.tiers, int) or not 1 <= self.tiers <= MAX_TIERS:
            raise ConfigError("tiers", self.tiers, f"expected an int in 1..{MAX_TIERS}")

    def delays_ms(self) -> tuple[int, ...]:
        """The ladder in milliseconds, one entry per retry, capped at ``max_delay``."""
        cap = parse_duration(self.max_delay, field="max_delay")
        delay = float(parse_duration(self.initial, field="initial"))
        out: list[int] = []
        for _ in range(self.tiers):
            out.append(min(cap, round(delay)))
            delay = min(float(cap), delay * self.multiplier)  # stays finite: never above the cap
        return tuple(out)


#: A schedule: an explicit list of delays (RocketMQ style) or an exponential ladder.
Schedule: TypeAlias = Sequence[DurationLike] | Exponential


@dataclass(frozen=True, slots=True, kw_only=True)
class InProcessRetry:
    """Immediate retries inside the handler call, before the record is republished to a tier.

    ``attempts`` counts handler calls in one poll cycle (the first call included), ``wait`` is the pause
    between them. The runtime drives these with tenacity; this value only describes and bounds them::

        InProcessRetry(attempts=3, wait="100ms").check_fits(300_000, handler_budget_ms=10_000)
    """

    attempts: int = 3
    wait: DurationLike = "100ms"

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or not 1 <= self.attempts <= 100:
            raise ConfigError("in_process.attempts", self.attempts, "expected an int in 1..100")
        parse_duration(self.wait, field="in_process.wait")

    @property
    def wait_ms(self) -> int:
        """``wait`` in milliseconds."""
        return parse_duration(self.wait, field="in_process.wait")

    def check_fits(self, max_poll_interval_ms: int, *, handler_budget_ms: int) -> None:
        """Raise :class:`ConfigError` if the in-process attempts could outlast ``max.poll.interval.ms``.

        The bound is ``attempts * (wait + handler_budget)``, slightly pessimistic (no wait follows the last
        attempt) on purpose: a poll loop that overruns is kicked out of the group and its partitions move.
        """
        if max_poll_interval_ms <= 0:
            raise ConfigError("max.poll.interval.ms", max_poll_interval_ms, "expected a positive number of ms")
        if handler_budget_ms < 0:
            raise ConfigError("handler_budget_ms", handler_budget_ms, "expected >= 0 ms")
        worst = self.attempts * (self.wait_ms + handler_budget_ms)
        if worst >= max_poll_interval_ms:
            raise ConfigError(
                "in_process",
                self,
                f"{self.attempts} attempts x ({self.wait_ms} ms wait + {handler_budget_ms} ms handler budget) = "
                f"{worst} ms could exceed max.poll.interval.ms={max_poll_interval_ms}; the consumer would be "
                "evicted from its group. Lower attempts or wait, or rely on retry tiers instead",
            )


def _empty_map() -> Mapping[type[BaseException], Schedule]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a failing record is retried: tier delays, attempts, timeout, jitter, classification.

    ``max_retries``: ``None`` gives one retry per entry of the schedule; ``0`` sends the first failure to the
    DLQ; ``N`` allows N retries, and retries beyond the schedule repeat its last tier; ``"unlimited"`` repeats
    the last tier until ``timeout``. ``timeout`` counts from the first failure. ``jitter`` in [0, 1] moves each
    delay by up to ``±jitter * delay`` (Artemis' collision avoidance), clamped to [0, longest tier delay].

    Classification: ``non_retryable`` beats ``retryable``; both match subclasses and walk ``__cause__`` /
    ``__context__``; ``retry_if(exc) -> False`` makes a failure non-retryable. ``per_exception`` gives some
    exception types their own schedule (the most specific type wins). An attribute named
    ``retry_after_attribute`` on the exception (seconds, a timedelta or a duration string) sends the record
    to the first tier at least that long. Every distinct delay of every schedule is one tier topic::

        RetryPolicy(delays=["1s", "5s", "30s"], max_retries=UNLIMITED, timeout="6h")
    """

    delays: Schedule = ("5s", "30s", "5m")
    max_retries: int | Literal["unlimited"] | None = None
    timeout: DurationLike | None = None
    jitter: float = 0.0
    retryable: tuple[type[BaseException], ...] = (Exception,)
    non_retryable: tuple[type[BaseException], ...] = ()
    retry_if: Callable[[BaseException], bool] | None = None
    per_exception: Mapping[type[BaseException], Schedule] = field(default_factory=_empty_map, hash=False)
    in_process: InProcessRetry | None = None
    retry_after_attribute: str = "retry_after"
    #: Distinct delays of all schedules, ascending; tier index = position. Derived.
    tier_delays_ms: tuple[int, ...] = field(init=False, compare=False)
    #: The default schedule in ms, one entry per retry. Derived.
    schedule_ms: tuple[int, ...] = field(init=False, compare=False, repr=False)
    #: ``per_exception`` with schedules in ms. Derived.
    per_exception_ms: Mapping[type[BaseException], tuple[int, ...]] = field(
        init=False, compare=False, repr=False, hash=False
    )
    #: ``timeout`` in ms, or None. Derived.
    timeout_ms: int | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        delays = self.delays if isinstance(self.delays, Exponential) else _as_tuple(self.delays, "delays")
        object.__setattr__(self, "delays", delays)
        object.__setattr__(self, "schedule_ms", _schedule_ms(delays, "delays"))
        self._check_max_retries()
        self._check_jitter()
        self._check_classifiers()
        self._normalise_per_exception()
        tiers = sorted({d for s in (self.schedule_ms, *self.per_exception_ms.values()) for d in s})
        if len(tiers) > MAX_TIERS:
            raise ConfigError("delays", len(tiers), f"{len(tiers)} distinct delays; at most {MAX_TIERS} tier topics")
        object.__setattr__(self, "tier_delays_ms", tuple(tiers))
        self._check_timeout()
        if self.in_process is not None and not isinstance(self.in_process, InProcessRetry):
            raise ConfigError("in_process", self.in_process, "expected an InProcessRetry or None")
        if not isinstance(self.retry_after_attribute, str) or not self.retry_after_attribute.isidentifier():
            raise ConfigError("retry_after_attribute", self.retry_after_attribute, "expected an attribute name")

    def _check_max_retries(self) -> None:
        value = self.max_retries
        if value is None or value == UNLIMITED:
            return
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_RETRIES_BOUND:
            raise ConfigError("max_retries", value, f"expected None, 'unlimited' or an int in 0..{_MAX_RETRIES_BOUND}")

    def _check_jitter(self) -> None:
        j = self.jitter
        if isinstance(j, bool) or not isinstance(j, int | float) or not (math.isfinite(j) and 0.0 <= j <= 1.0):
            raise ConfigError("jitter", j, "expected a number in [0, 1], e.g. 0.15 for ±15%")

    def _check_classifiers(self) -> None:
        for name in ("retryable", "non_retryable"):
            types = _as_tuple(getattr(self, name), name)
            for i, t in enumerate(types):
                if not (isinstance(t, type) and issubclass(t, BaseException)):
                    raise ConfigError(f"{name}[{i}]", t, "expected an exception class")
            object.__setattr__(self, name, types)
        if self.retry_if is not None and not callable(self.retry_if):
            raise ConfigError("retry_if", self.retry_if, "expected a callable (exception) -> bool, or None")

    def _normalise_per_exception(self) -> None:
        if not isinstance(self.per_exception, Mapping):
            raise ConfigError("per_exception", self.per_exception, "expected a mapping {ExceptionType: schedule}")
        kept: dict[type[BaseException], Schedule] = {}
        in_ms: dict[type[BaseException], tuple[int, ...]] = {}
        for exc_type, schedule in self.per_exception.items():
            if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
                raise ConfigError("per_exception", exc_type, "keys must be exception classes")
            name = f"per_exception[{exc_type.__name__}]"
            kept[exc_type] = schedule if isinstance(schedule, Exponential) else _as_tuple(schedule, name)
            in_ms[exc_type] = _schedule_ms(kept[exc_type], name)
        object.__setattr__(self, "per_exception", MappingProxyType(kept))
        object.__setattr__(self, "per_exception_ms", MappingProxyType(in_ms))

    def _check_timeout(self) -> None:
        if self.timeout is None:
            object.__setattr__(self, "timeout_ms", None)
            return
        timeout_ms = parse_duration(self.timeout, field="timeout")
        if timeout_ms < self.tier_delays_ms[0]:
            raise ConfigError(
                "timeout",
                self.timeout,
                f"shorter than the shortest tier ({self.tier_delays_ms[0]} ms): "
                "no retry could ever happen; use max_retries=0 to go straight to the DLQ",
            )
        object.__setattr__(self, "timeout_ms", timeout_ms)

    @classmethod
    def rocketmq(cls, **overrides: Any) -> RetryPolicy:
        """RocketMQ's 18 delay levels as tiers, one retry per level (1s ... 2h, 4h45m46s in total).

        A RocketMQ consumer starts at level 3 with 16 retries; ``RetryPolicy.rocketmq(delays=ROCKETMQ_LEVELS[2:])``
        reproduces that exactly. Unknown override names raise :class:`ConfigError`.
        """
        known = {f.name for f in fields(cls) if f.init}
        for name in overrides:
            if name not in known:
                raise ConfigError(name, overrides[name], f"unknown RetryPolicy option; known: {sorted(known)}")
        return cls(**{"delays": ROCKETMQ_LEVELS, **overrides})

    @property
    def max_delay_ms(self) -> int:
        """The longest tier delay: the cap for jitter and for retry-after hints."""
        return self.tier_delays_ms[-1]

    def max_retries_for(self, schedule_ms: Sequence[int]) -> int | None:
        """How many retries a failure on ``schedule_ms`` may have; ``None`` = unlimited (bounded by timeout)."""
        if self.max_retries == UNLIMITED:
            return None
        if self.max_retries is None:
            return len(schedule_ms)
        return int(self.max_retries)

    @property
    def max_reconsume_times(self) -> int | None:
        """The largest ``retry.reconsume_times`` a tier record can carry under this policy; None if unlimited."""
        schedules = (self.schedule_ms, *self.per_exception_ms.values())
        bounds = [self.max_retries_for(s) for s in schedules]
        return None if None in bounds else max(b for b in bounds if b is not None)


def _as_tuple(value: object, name: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError(name, value, "expected a list or tuple")
    return tuple(value)


def _schedule_ms(schedule: Schedule, name: str) -> tuple[int, ...]:
    if isinstance(schedule, Exponential):
        return schedule.delays_ms()
    if not schedule:
        raise ConfigError(name, schedule, "needs at least one delay; use max_retries=0 to go straight to the DLQ")
    if len(schedule) > MAX_TIERS:
        raise ConfigError(name, len(schedule), f"at most {MAX_TIERS} entries")
    return tuple(parse_duration(d, field=f"{name}[{i}]") for i, d in enumerate(schedule))
