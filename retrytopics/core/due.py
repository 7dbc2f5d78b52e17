"""When a tier record is due, and how late a due time may be: the rules the router writes by and the tier
consumers read by, in one place (changing one side alone would dead-letter valid records as
`invalid_retry_headers`, or let forged ones hold a partition).

Pure: standard library only; time and randomness are arguments.

- A failed record is due `delay ± jitter` after its last failure (`next_due_ms`): a retry-after hint picks
  the tier and floors the wait, jitter never takes from it.
- The longest a record of a tier is meant to wait is its delay with the most jitter (`longest_wait_ms`).
- A reader refuses a due time later than `longest` after its last failure, or later than `longest` plus the
  clock-skew allowance from now (`due_problem`): no writer of this module produces either.
- A consumer waits no longer than `longest` after it first saw a record not due (`bounded_due_ms`), whatever
  the header says: under clock skew the wait is the tier's delay in real elapsed time.
"""

from __future__ import annotations

import math
import random

from retrytopics.core.backoff import jittered_delay_ms

__all__ = ["bounded_due_ms", "due_problem", "longest_wait_ms", "next_due_ms"]


def longest_wait_ms(delay_ms: int, jitter: float) -> int:
    """The longest a record of a tier with `delay_ms` waits: its delay with the most jitter."""
    return math.ceil(delay_ms * (1 + jitter))


def next_due_ms(
    last_failed_at: int, delay_ms: int, *, jitter: float, max_delay_ms: int, hint_ms: int | None, rng: random.Random
) -> int:
    """When a record that last failed at `last_failed_at` is due on the tier of `delay_ms`. With a retry-after
    hint (`hint_ms`, the tier chosen for it), jitter may add to the hint, never take from it."""
    floor = 0 if hint_ms is None else min(hint_ms, delay_ms)
    return last_failed_at + max(floor, jittered_delay_ms(delay_ms, jitter=jitter, max_delay_ms=max_delay_ms, rng=rng))


def due_problem(due_at: int, last_failed_at: int, *, longest_ms: int, now_ms: int, skew_ms: int) -> str | None:
    """Why a tier record's `retry.due_at` cannot have been written by `next_due_ms` (None: it can)."""
    if due_at > now_ms + longest_ms + skew_ms:
        return f"later than now + this tier's delay ({longest_ms} ms with jitter)"
    if due_at > last_failed_at + longest_ms:
        return f"more than this tier's delay ({longest_ms} ms) after retry.last_failed_at"
    return None


def bounded_due_ms(due_at: int, *, first_seen_ms: int, longest_ms: int) -> int:
    """`due_at`, but no later than `longest_ms` after the consumer first saw the record not due."""
    return min(due_at, first_seen_ms + longest_ms)
