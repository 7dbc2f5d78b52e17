"""Back-off arithmetic: the n-th delay of a schedule, jitter, and the tier for a retry-after hint.

Pure: integers in, integers out; randomness comes from the ``random.Random`` the caller passes, so a test
(or a replay of an incident) can seed it::

    >>> schedule_delay_ms((5000, 30000), 3)         # past the end: the last delay repeats
    30000
    >>> tier_for_hint((5000, 30000, 300000), 20000)  # first tier at least as long as the hint
    1
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence

from retrytopics.core.errors import ConfigError

__all__ = ["jittered_delay_ms", "schedule_delay_ms", "tier_for_hint"]


def jittered_delay_ms(delay_ms: int, *, jitter: float, max_delay_ms: int, rng: random.Random) -> int:
    """``delay + delay * (±jitter) * U(0, 1)``, rounded, clamped to ``[0, max_delay_ms]`` (Artemis' formula).

    With ``jitter=0`` the delay comes back unchanged (clamped), and ``rng`` is not touched::

        jittered_delay_ms(10_000, jitter=0.1, max_delay_ms=60_000, rng=random.Random(7))  # in 9000..11000
    """
    if delay_ms < 0 or max_delay_ms < 0:
        raise ConfigError("delay_ms", (delay_ms, max_delay_ms), "delays cannot be negative")
    if not (math.isfinite(jitter) and 0.0 <= jitter <= 1.0):
        raise ConfigError("jitter", jitter, "expected a number in [0, 1]")
    if jitter == 0.0:
        return min(delay_ms, max_delay_ms)
    # uniform(-j, j) is the same distribution as a fair sign times j * U(0,1), from one draw.
    moved = delay_ms + delay_ms * rng.uniform(-jitter, jitter)
    return max(0, min(max_delay_ms, round(moved)))


def tier_for_hint(tier_delays_ms: Sequence[int], hint_ms: int) -> int:
    """Index of the first tier whose delay is ``>= hint_ms``: a retry-after hint is never honoured early.

    ``tier_delays_ms`` must be ascending, as ``RetryPolicy.tier_delays_ms`` is. A hint longer than the
    longest tier is capped to the longest tier (the record comes back sooner than the hint asked): holding
    it longer would need a due time beyond its tier's delay, which tier consumers reject as forged, and
    would block every record queued behind it in the partition.
    """
    if not tier_delays_ms:
        raise ConfigError("tier_delays_ms", tier_delays_ms, "no tiers to choose from")
    index = bisect.bisect_left(tier_delays_ms, max(0, hint_ms))
    return min(index, len(tier_delays_ms) - 1)


def schedule_delay_ms(schedule_ms: Sequence[int], reconsume_times: int) -> int:
    """The delay before retry number ``reconsume_times`` (1-based); past the end, the last delay repeats.

    That repetition is how ``max_retries`` beyond the schedule and ``"unlimited"`` reuse the last tier's
    topic instead of creating new ones.
    """
    if not schedule_ms:
        raise ConfigError("schedule_ms", schedule_ms, "a schedule needs at least one delay")
    if reconsume_times < 1:
        raise ConfigError("reconsume_times", reconsume_times, "retries are numbered from 1")
    return schedule_ms[min(reconsume_times, len(schedule_ms)) - 1]
