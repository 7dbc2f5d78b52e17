"""A tier consumer's key order, pure (docs/key-ordering.md, section 4): what it knows of each chain whose records
it read (`TierPassages`), and what it says of a retried record or a follower (`TierDecision`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from retrytopics.core.keyorder.config import DeadHeadPolicy, KeyOrdering
from retrytopics.core.keyorder.keys import ChainKey
from retrytopics.core.keyorder.state_records import Closed, Fate, KeyStateRecord, Passage

__all__ = ["Step", "TierDecision", "TierPassages"]


class Step(StrEnum):
    """What a tier consumer does with a record of an ordered handler."""

    HANDLE = "handle"
    """Every earlier record of its key is terminal: handle it now (a follower's first attempt: a failure
    routes as a source record's first failure would)."""
    FORWARD = "forward"
    """A follower whose predecessor went on to `TierDecision.tier`: hand it off there, waiting behind
    `TierDecision.after`."""
    DEAD_LETTER = "dead_letter"
    """A follower whose predecessor was dead-lettered, under `dead_letter`: to the DLQ, reason
    ``blocked_by_key``."""
    DUPLICATE = "duplicate"
    """A copy of a follower this consumer has read already (a crash repeated a hop): finish it."""
    WAIT = "wait"
    """The hop of the key's last record read here is not acknowledged yet: stop the partition at this record
    until it is."""
    UNPROVEN = "unproven"
    """A follower whose predecessor nothing here accounts for (a forged record, a key-state topic lost, a
    key forgotten past `max_tracked_records`): never handled out of order; the runtime dead-letters it as
    ``blocked_by_key``."""


@dataclass(frozen=True, slots=True)
class TierDecision:
    step: Step
    tier: int | None = None
    after: int | None = None


_T_HANDLE: Final = TierDecision(Step.HANDLE)
_T_WAIT: Final = TierDecision(Step.WAIT)
_T_DUPLICATE: Final = TierDecision(Step.DUPLICATE)
_T_UNPROVEN: Final = TierDecision(Step.UNPROVEN)
_T_DEAD_LETTER: Final = TierDecision(Step.DEAD_LETTER)


@dataclass(slots=True)
class _Entry:
    fate: Fate
    to_tier: int | None = None
    after: int | None = None
    fallback: tuple[Fate, int | None, int | None] | None = None  # kept if a forwarded follower is dropped


@dataclass(slots=True)
class _Known:
    entries: dict[int, _Entry] = field(default_factory=dict)  # source offset -> its last fate here
    floor: int = -1  # every record of the chain up to this offset is terminal
    pending: int | None = None  # the record whose hop is not acknowledged yet


class TierPassages:
    """What one tier's consumer knows of the chains whose records it read (for every partition it owns): per
    record, what it did with it the last time it read it. A record can pass one tier more than once (it
    failed there and was sent back, or followed its predecessor back), so this is per record, not per key;
    everything below a record settled here is terminal and forgotten. It reads the key-state topic only at
    assignment (`rebuild`): what it needs of a follower's predecessor it learnt itself, because the
    predecessor was placed in its partition first.

    Ask it about each record of an ordered handler (`on_retry` for a retried record, `on_follower`); tell it
    what became of each (`handled`, `forwarded`, `dead_lettered`, then `acked` for hops); write the records
    they return before committing past the record.
    """

    def __init__(self, config: KeyOrdering, *, tier: int) -> None:
        self.config = config
        self.tier = tier
        self._known: OrderedDict[ChainKey, _Known] = OrderedDict()
        self._entries = 0

    @classmethod
    def rebuild(
        cls, config: KeyOrdering, records: Iterable[KeyStateRecord], *, tier: int
    ) -> tuple[TierPassages, list[Closed]]:
        """The state a consumer of `tier` starts from at assignment, from every key-state record in the order
        read (it keeps its own passages and their tombstones), and the tombstones to write for passages it no
        longer needs."""
        passages = cls(config, tier=tier)
        stale: dict[tuple[ChainKey, int | None], Closed] = {}
        for record in records:
            if isinstance(record, Passage) and record.tier == tier:
                entry = _Entry(record.fate, record.to_tier, record.after)
                written = passages._put(record.chain, record.seen, entry)
                stale |= {(c.chain, c.seen): c for c in written if isinstance(c, Closed)}
            elif isinstance(record, Closed) and record.tier == tier and record.seen is not None:
                stale.pop((record.chain, record.seen), None)
                known = passages._known.get(record.chain)
                if known is not None and known.entries.pop(record.seen, None) is not None:
                    passages._entries -= 1
        return passages, list(stale.values())

    def tracked(self) -> int:
        """How many records of open chains this consumer remembers."""
        return self._entries

    def on_retry(self, chain: ChainKey) -> TierDecision:
        """A retried record of `chain` (it was handled once, so every earlier record of its key is terminal):
        handle it, unless a hop of its chain read here is still in flight."""
        known = self._known.get(chain)
        return _T_WAIT if known is not None and known.pending is not None else _T_HANDLE

    def on_follower(self, chain: ChainKey, offset: int, after: int) -> TierDecision:
        """What to do with the follower at source `offset` of `chain` that waits behind `after`."""
        known = self._known.get(chain)
        if known is not None and known.pending is not None:
            return _T_WAIT
        entry = None if known is None else known.entries.get(after)
        if entry is None:  # a copy of a record at or below one settled here, or nothing here accounts for it
            return _T_DUPLICATE if known is not None and offset <= known.floor else _T_UNPROVEN
        if entry.fate is Fate.SENT:
            return TierDecision(Step.FORWARD, entry.to_tier, entry.after)
        if entry.fate is Fate.DEAD_LETTERED and self.config.dead_head is DeadHeadPolicy.DEAD_LETTER:
            return _T_DEAD_LETTER
        return _T_HANDLE

    def handled(
        self, chain: ChainKey, offset: int, *, to_tier: int | None, dead_lettered: bool = False
    ) -> list[KeyStateRecord]:
        """The handler ran for the record at source `offset` (retried, or a follower on `Step.HANDLE`): it
        succeeded (`to_tier` None and not `dead_lettered`: returns the records to write), or it was routed to
        `to_tier` or to the DLQ (`dead_lettered`), and `acked` settles it."""
        if to_tier is None and not dead_lettered:
            return self._put(chain, offset, _Entry(Fate.SUCCEEDED))
        entry = _Entry(Fate.DEAD_LETTERED) if to_tier is None else _Entry(Fate.SENT, to_tier, offset)
        return self._put(chain, offset, entry, pending=True)

    def forwarded(self, chain: ChainKey, offset: int, *, after: int, to_tier: int) -> list[KeyStateRecord]:
        """The follower at `offset`, waiting behind `after`, was produced to `to_tier` (on `Step.FORWARD`);
        `acked` settles it."""
        behind = self._known[chain].entries[after]
        entry = _Entry(Fate.SENT, to_tier, offset, fallback=(behind.fate, behind.to_tier, behind.after))
        return self._put(chain, offset, entry, pending=True)

    def dead_lettered(self, chain: ChainKey, offset: int) -> list[KeyStateRecord]:
        """The follower at `offset` was produced to the DLQ unhandled (`Step.DEAD_LETTER` or `Step.UNPROVEN`);
        `acked` settles it. The records behind it are dead-lettered too under `dead_letter`, released under
        `release`."""
        return self._put(chain, offset, _Entry(Fate.DEAD_LETTERED), pending=True)

    def acked(self, chain: ChainKey, offset: int, *, landed: int | None) -> list[KeyStateRecord]:
        """The hop of `offset` was acknowledged in tier `landed`, or in the DLQ (None: routed there, or refused
        by its tier as too large). Returns the records to write."""
        known = self._known.get(chain)
        entry = None if known is None or known.pending != offset else known.entries.get(offset)
        if known is None or entry is None:
            return []
        known.pending = None
        if landed is not None:
            entry.to_tier = landed
        elif entry.fallback is None:  # a handled record (or a follower dead-lettered unhandled) is in the DLQ
            entry.fate, entry.to_tier, entry.after = Fate.DEAD_LETTERED, None, None
        else:  # a follower dropped on its way: the next one waits where it would have waited
            entry.fate, entry.to_tier, entry.after = entry.fallback
        entry.fallback = None
        return self._put(chain, offset, entry)

    def _put(self, chain: ChainKey, offset: int, entry: _Entry, *, pending: bool = False) -> list[KeyStateRecord]:
        """Remember `entry` for `offset`; a final one returns its passage to write, and, when terminal, the
        tombstones of the passages below it (no follower can need them)."""
        known = self._known.get(chain)
        if known is None:
            known = self._known[chain] = _Known()
        self._known.move_to_end(chain)
        self._entries += offset not in known.entries
        known.entries[offset] = entry
        if pending:
            known.pending = offset
            return self._bound()
        out: list[KeyStateRecord] = [self._passage(chain, offset, entry)]
        if entry.fate is not Fate.SENT and offset > known.floor:
            known.floor = offset
            for below in [o for o in known.entries if o < offset]:
                del known.entries[below]
                self._entries -= 1
                out.append(Closed(chain=chain, tier=self.tier, seen=below))
        return out + self._bound()

    def _bound(self) -> list[KeyStateRecord]:
        """Past `max_tracked_records` records remembered, forget the least recently used idle chain (a late
        follower of it is then unproven, never handled out of order); returns the tombstones of its passages."""
        out: list[KeyStateRecord] = []
        while self._entries > self.config.max_tracked_records:
            idle = next((c for c, k in self._known.items() if k.pending is None), None)
            if idle is None:
                break
            known = self._known.pop(idle)
            self._entries -= len(known.entries)
            out += [Closed(chain=idle, tier=self.tier, seen=seen) for seen in known.entries]
        return out

    def _passage(self, chain: ChainKey, offset: int, entry: _Entry) -> Passage:
        sent = entry.fate is Fate.SENT
        return Passage(
            tier=self.tier,
            chain=chain,
            seen=offset,
            fate=entry.fate,
            to_tier=entry.to_tier if sent else None,
            after=entry.after if sent else None,
        )
