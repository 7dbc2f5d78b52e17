"""What the hand-off tells key order (docs/key-ordering.md, sections 4 and 8): one listener for the three moments
of an ordered record's hand-off. `KeyOrder` (a main consumer) and `TierOrder` (a tier consumer) are the
listeners (runtime/keyorder/ordering.py); the hand-off (runtime/handoff/ordered.py) knows them by a Protocol of
its own that asks the same methods (`KeyChains`), so neither folder imports the other; the consumer loop hands
one to the other as a `KeyOrderListener`, so the type checker proves they still match. Each answer is the
key-state records the hand-off writes before the record's offset is finished (write before commit); where they go
is asked too (`ordered`, `state_topic`, `state_keys`)."""

from __future__ import annotations

from typing import Protocol

from retrytopics.core.keyorder.hops import Origin
from retrytopics.core.keyorder.state_records import KeyStateRecord
from retrytopics.core.signing import HeaderKeys

__all__ = ["KeyOrderListener"]


class KeyOrderListener(Protocol):
    """Told of every hand-off and success of an ordered record."""

    def ordered(self, topic: str) -> bool:
        """Whether `topic`'s handler is key-ordered in this loop."""

    def state_topic(self, source: str) -> str:
        """The key-state topic of ordered source topic `source`."""

    def state_keys(self, source: str) -> HeaderKeys | None:
        """The keys that sign `source`'s key-state records (None: unsigned)."""

    def sent(
        self, at: Origin, *, to_tier: int | None, handled: bool, behind: int | None = None
    ) -> list[KeyStateRecord]:
        """A hop of the record `at` is being produced: after its handler ran (`handled`) to tier `to_tier`
        (None: the DLQ), or unhandled as a follower waiting behind source offset `behind`."""

    def acked(self, at: Origin, landed: int | None) -> list[KeyStateRecord]:
        """The hop of `at` is acknowledged in tier `landed` (None: the DLQ)."""

    def succeeded(self, at: Origin) -> list[KeyStateRecord]:
        """The handler of `at` returned: it is terminal."""
