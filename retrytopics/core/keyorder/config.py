"""Key ordering's configuration: `KeyOrdering` for one handler, and `DeadHeadPolicy` (docs/key-ordering.md)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from retrytopics.core.errors import ConfigError

__all__ = ["DeadHeadPolicy", "KeyOrdering"]


class DeadHeadPolicy(StrEnum):
    """What a dead-lettered record does to the records of its key waiting behind it."""

    RELEASE = "release"
    """The followers proceed in order; the dead-lettered record is simply terminal (the default)."""
    DEAD_LETTER = "dead_letter"
    """The followers already waiting behind it are dead-lettered too, in order, with reason
    ``blocked_by_key``, so that a replay of the DLQ restores the whole sequence in source order."""


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(name, value, "expected an int >= 1")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyOrdering:
    """Key ordering for one handler (``@app.handler("orders", ordering=KeyOrdering())``).

    ``dead_head``: what a dead-lettered record does to its followers (`DeadHeadPolicy`).
    ``max_blocked_keys``: open chains per source partition; the main consumer pauses the partition before a
    record of a new key when it has this many (blocking, counted and logged), about 200 bytes each.
    ``max_tracked_records``: records of open chains a tier consumer remembers (for every partition it owns),
    about 150 bytes each; past it, the least recently used idle chain is forgotten (a late follower of it is
    dead-lettered, never handled out of order).

    Example: ``KeyOrdering(dead_head="dead_letter", max_blocked_keys=500)``. A bound too low pauses source
    partitions whenever that many keys fail at once; too high costs memory only when keys do fail.
    """

    dead_head: DeadHeadPolicy = DeadHeadPolicy.RELEASE
    max_blocked_keys: int = 1_000
    max_tracked_records: int = 100_000

    def __post_init__(self) -> None:
        if self.dead_head not in set(DeadHeadPolicy):
            raise ConfigError("dead_head", self.dead_head, f"expected one of {[p.value for p in DeadHeadPolicy]}")
        object.__setattr__(self, "dead_head", DeadHeadPolicy(self.dead_head))
        _positive_int("max_blocked_keys", self.max_blocked_keys)
        _positive_int("max_tracked_records", self.max_tracked_records)
        if self.max_tracked_records < self.max_blocked_keys:
            raise ConfigError("max_tracked_records", self.max_tracked_records, "expected at least max_blocked_keys")
