"""Running counts of a pipeline's tier and DLQ records, for the pipeline page: DLQ by reason and by
exception type, failures per attempt (the recovery rate of each tier), and failures, retries and dead
letters over time.

Pure and bounded: a reader thread feeds it every record of the tiers and the DLQ once (`add`); it keeps
counters only, at most `MAX_KEYS` distinct exception types and attempts (the rest count as "(other)"), and
`buckets` time buckets. Record headers are untrusted: a forged reconsume count or exception type can only
move a counter.

A record's `reconsume_times` n says it failed n times. Each failure of a record is written exactly once:
to a tier (it will be retried) or to the DLQ. So the records that failed at least n times number
`tier[n] + dlq[n]`, and of the records a tier held with count n, `tier[n] - lag` were handled and
`tier[n+1] + dlq[n+1]` of them failed again: the rest recovered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from retrytopics.core.headers import RetryHeaders

__all__ = ["OTHER", "Recovery", "Tally"]

OTHER: Final = "(other)"
MAX_KEYS: Final = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """One tier's retries: records it held, handled (held minus lag), failed again, and recovered."""

    topic: str
    held: int
    handled: int
    failed_again: int

    @property
    def recovered(self) -> int:
        return max(0, self.handled - self.failed_again)

    @property
    def rate(self) -> float | None:
        """Recovered / handled, or None before any record was handled."""
        return None if self.handled <= 0 else min(1.0, self.recovered / self.handled)


def _bounded(counter: Counter[str], key: str) -> None:
    counter[key if key in counter or len(counter) < MAX_KEYS else OTHER] += 1


class Tally:
    """Counters of the tier and DLQ records seen so far (see the module docstring)."""

    def __init__(self, *, bucket_ms: int = 10_000, buckets: int = 90) -> None:
        if bucket_ms < 1 or buckets < 2:
            raise ValueError("bucket_ms >= 1 and buckets >= 2")
        self.bucket_ms = bucket_ms
        self.buckets = buckets
        self.records = 0
        self.undecodable = 0
        self.dlq_by_reason: Counter[str] = Counter()
        self.dlq_by_type: Counter[str] = Counter()
        self._tier_attempts: dict[str, Counter[int]] = {}
        self._dlq_attempts: Counter[int] = Counter()
        #: bucket index → [failures (first ones), retries (tier records), dead letters]
        self._series: dict[int, list[int]] = {}
        self._newest: int | None = None

    def add(self, *, topic: str, kind: str, timestamp_ms: int, retry: RetryHeaders | None) -> None:
        """Count one record of a tier (`kind="tier"`) or of the DLQ (`kind="dlq"`)."""
        self.records += 1
        if kind == "dlq":
            reason = retry.dlq_reason.value if retry is not None and retry.dlq_reason is not None else "bad headers"
            self.dlq_by_reason[reason] += 1
            _bounded(self.dlq_by_type, retry.exception_type if retry is not None else "(unreadable headers)")
        if retry is None:
            self.undecodable += 1
        else:
            attempts = self._dlq_attempts if kind == "dlq" else self._tier_attempts.setdefault(topic, Counter())
            n = retry.reconsume_times
            attempts[n if n in attempts or len(attempts) < MAX_KEYS else -1] += 1
        self._count_in_time(timestamp_ms, kind, first=retry is not None and retry.reconsume_times == 1)

    def _count_in_time(self, timestamp_ms: int, kind: str, *, first: bool) -> None:
        index = timestamp_ms // self.bucket_ms
        newest = index if self._newest is None else max(self._newest, index)
        self._newest = newest
        if index <= newest - self.buckets:
            return  # older than the chart's window
        row = self._series.get(index)
        if row is None:
            row = self._series[index] = [0, 0, 0]
            for old in [i for i in self._series if i <= newest - self.buckets]:
                del self._series[old]
        row[0] += first
        row[1 if kind == "tier" else 2] += 1

    def recovery(self, tiers: Sequence[str], lag: Mapping[str, int]) -> list[Recovery]:
        """Per tier topic, in pipeline order; `lag`: records a tier still holds unhandled."""
        failed_at_least: Counter[int] = Counter(self._dlq_attempts)
        for attempts in self._tier_attempts.values():
            failed_at_least.update(attempts)
        out = []
        for topic in tiers:
            attempts = self._tier_attempts.get(topic, Counter())
            held = sum(attempts.values())
            again = sum(failed_at_least[n + 1] for n in attempts if n > 0)
            out.append(Recovery(topic=topic, held=held, handled=max(0, held - lag.get(topic, 0)), failed_again=again))
        return out

    def series(self, now_ms: int) -> list[tuple[int, int, int, int]]:
        """(bucket start ms, failures, retries, dead letters) for each of the last `buckets` buckets up to
        `now_ms`, oldest first, zeros included."""
        last = now_ms // self.bucket_ms
        return [(i * self.bucket_ms, *self._series.get(i, (0, 0, 0))) for i in range(last - self.buckets + 1, last + 1)]
