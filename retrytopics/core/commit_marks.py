"""The mark this library writes into the metadata of every offset it commits, and what the next owner of a
partition learns from it: since when the hand-offs found downstream count as hand-offs of records it is about
to read again (runtime/records/duplicates.py, seeding at assignment).

Kafka keeps a short string with each committed offset. Ours reads ``retrytopics/1 seed-floor=<ms>``. An offset
committed by anyone else carries other metadata (``kafka-consumer-groups --reset-offsets`` and admin clients
write none): someone moved the group's position on purpose, and every record from there on is to be handled
again, although the hops of its earlier handling are still downstream. So the first owner that finds such an
offset takes its own clock as the floor and writes it into its commits: a hop written before the floor is not
taken for the hop of a record it reads. A partition with no committed offset (a new group, or one whose owner
died before its first commit) has floor 0: every hop found counts.

Errors only go the safe way: a hop whose timestamp is missing or below the floor (a writer's clock behind) is not
recognised, and its record is handled again (at-least-once), never skipped.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MARK_PREFIX", "commit_mark", "seed_floor"]

MARK_PREFIX: Final = "retrytopics/1 seed-floor="
#: a floor is a Unix time in milliseconds: at most 15 digits until the year 33658
_MAX_DIGITS: Final = 15


def commit_mark(floor_ms: int) -> str:
    """The metadata of an offset this library commits for a partition whose seed floor is `floor_ms`."""
    if floor_ms < 0:
        raise ValueError(f"floor_ms must be >= 0, not {floor_ms}")
    return f"{MARK_PREFIX}{floor_ms}"


def seed_floor(metadata: str | None, now_ms: int) -> int:
    """The seed floor of a partition whose committed offset carries `metadata` (None: no committed offset):
    0 with no committed offset, the floor our mark carries, `now_ms` for an offset someone else committed
    (or a mark that does not parse: metadata is written by whoever may commit for the group)."""
    if metadata is None:
        return 0
    if metadata.startswith(MARK_PREFIX):
        digits = metadata[len(MARK_PREFIX) :]
        if 0 < len(digits) <= _MAX_DIGITS and digits.isascii() and digits.isdigit():
            return int(digits)
    return now_ms
