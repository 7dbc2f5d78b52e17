"""Consumer lag in records and in seconds, from end offsets sampled over time (pure: time is an argument).

A partition's lag in records is its end offset minus the offset the consumer will read again from (its first
unhandled record). Its lag in seconds is how long ago that record was appended: the end offsets a consumer
samples (once a second at most, runtime/lag.py) tell when each offset was passed, so the first unhandled
offset's append time is interpolated between the last sample that had not reached it and the first that had
(kafka-lag-exporter's method, with the consumer's own samples). Beyond the oldest sample kept, the answer is a
lower bound: the record is at least that old.

For a tier, the lag in seconds includes the wait a record is meant to have (its tier's delay): the tier's own
question, "is a record that is due waiting unhandled?", is `oldest due` (runtime/waiting.py's heads).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["MAX_SAMPLES", "EndOffsetSamples"]

#: end-offset changes kept per partition: at one sample a second, the interpolation reaches this many
#: changes back (a partition written continuously: about 10 minutes)
MAX_SAMPLES = 600


@dataclass(slots=True)
class EndOffsetSamples:
    """The end offsets one partition had, when they changed: (end offset, wall time in ms), oldest first."""

    samples: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def add(self, end_offset: int, now_ms: int) -> None:
        """Remember `end_offset` read at `now_ms` (kept only when it moved: a still partition costs nothing)."""
        if not self.samples or self.samples[-1][0] != end_offset:
            self.samples.append((end_offset, now_ms))

    def lag_ms(self, unhandled_from: int, now_ms: int) -> int:
        """How long ago the record at `unhandled_from` was appended (0: nothing is unhandled)."""
        samples = self.samples
        if not samples or samples[-1][0] <= unhandled_from:
            return 0
        before: tuple[int, int] | None = None  # the last sample that had not reached the record
        for end, at in samples:
            if end > unhandled_from:
                if before is None:
                    return max(0, now_ms - at)  # older than every sample kept: a lower bound
                end_before, at_before = before
                share = (unhandled_from - end_before + 1) / (end - end_before)
                return max(0, now_ms - round(at_before + share * (at - at_before)))
            before = (end, at)
        return 0
