"""A main consumer's key order, pure (docs/key-ordering.md, section 4): the open chains of one source partition
(`SourceChains`), what it says of a source record before its handler runs (`Admission`), which follower kept in
the source may run now (`Release`), and where a key-ordered batch handler's call ends (`batch_end`).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from retrytopics.core.keyorder.config import DeadHeadPolicy, KeyOrdering
from retrytopics.core.keyorder.keys import ChainKey
from retrytopics.core.keyorder.state_records import Chain, Closed, Fate, KeyStateRecord, Passage, Waiting

__all__ = ["Admission", "Admit", "Release", "SourceChains", "batch_end"]


def batch_end(keys: Sequence[bytes | None]) -> int:
    """How many records, from the start of `keys` (a run of one partition, as `key_id`s; None: no key), one batch
    call may take: up to the second record of a key already in it, which must wait for the call's outcome (it
    follows the first if that one fails). Records without a key never end a call::

        batch_end([b"a", b"b", None, None, b"a", b"c"])   # 4
    """
    seen: set[bytes] = set()
    for index, key in enumerate(keys):
        if key is not None:
            if key in seen:
                return index
            seen.add(key)
    return len(keys)


class Admit(StrEnum):
    """What the main consumer does with a source record, before any handler runs."""

    HANDLE = "handle"
    """Its key is not blocked (or it has no key): handle it as usual."""
    FOLLOW = "follow"
    """Its key is blocked: hand it off as a follower to `Admission.tier`, waiting behind `Admission.after`."""
    WAIT = "wait"
    """The hand-off of its key's last record is not acknowledged yet: stop the partition at this record until
    it is (a refused hand-off changes where this one must go)."""
    PAUSE = "pause"
    """`max_blocked_keys` chains are open and this record could open one more: pause the partition until a
    chain closes (blocking, counted and logged)."""
    KEEP = "keep"
    """Its key is blocked and followers wait in the source (`SourceChains(followers_in_source=True)`): write
    what `kept` returns, then finish its offset unhandled; `releases` says when to read it again."""


@dataclass(frozen=True, slots=True)
class Admission:
    action: Admit
    tier: int | None = None
    after: int | None = None


_HANDLE: Final = Admission(Admit.HANDLE)
_WAIT: Final = Admission(Admit.WAIT)
_PAUSE: Final = Admission(Admit.PAUSE)
_KEEP: Final = Admission(Admit.KEEP)


@dataclass(frozen=True, slots=True)
class Release:
    """A follower kept in the source whose every earlier record is terminal: read the record at source `offset`
    again and handle it as a source record (`dead_letter`: dead-letter it unhandled as ``blocked_by_key``
    instead, the key's `dead_letter` policy behind a dead-lettered record). Then tell `SourceChains` what
    became of it: `succeeded`, or `handed_off` and `acked` for the hop of a failure or a dead letter."""

    key: bytes
    offset: int
    dead_letter: bool


@dataclass(slots=True)
class _Open:
    head: int
    frontier: int
    at_tier: int
    followers: int
    since_ms: int
    pending: int | None = None  # offset of a follower whose hand-off is not acknowledged yet
    anchor: tuple[int, int] = (0, 0)  # (tier, frontier) as the chain record says: where `_chase` walks from
    waiting: list[int] = field(default_factory=list)  # followers kept in the source, in offset order
    settled_here: Fate | None = None  # the frontier's fate when this owner settled it (a released follower)
    releasing: int | None = None  # a released follower being handled here

    def __post_init__(self) -> None:
        self.anchor = (self.at_tier, self.frontier)


class SourceChains:
    """The open chains of one source partition, held by its main consumer (one instance per assignment).

    Ask it about every source record before its handler (`admit`); tell it of every hand-off (`handed_off`,
    then `acked` with where the record landed) and of every key-state record of its partition as it is read
    (`learn`); write what `acked` and `learn` return before committing past the record. `rebuild` makes the
    state a new owner starts from. Its own chain records are never read back live: this instance is their
    only writer, and its memory is newer than any of them.

    `followers_in_source`: a record of a blocked key is not handed off into a tier behind its predecessor
    (`Admit.FOLLOW`, which moves it again each time the chain's front moves) but kept in the source
    (`Admit.KEEP`: a `Waiting` record, then its offset is finished), and read again from the source once every
    earlier record of its key is terminal (`releases`): no tier write for a follower that succeeds. Records
    written the other way (followers in tiers, version 1 chain records) are read and honoured either way.
    """

    def __init__(self, config: KeyOrdering, *, source: str, partition: int, followers_in_source: bool = False) -> None:
        self.config = config
        self.source = source
        self.partition = partition
        self.followers_in_source = followers_in_source
        self._open: dict[bytes, _Open] = {}
        self._passages: dict[bytes, dict[tuple[int, int], Passage]] = {}  # key -> (tier, seen) -> passage
        self._settled: dict[bytes, int] = {}  # key -> highest offset a passage shows terminal (all below are too)
        self._settled_fate: dict[bytes, Fate] = {}  # key -> that passage's fate
        self._starting: dict[bytes, tuple[int, int]] = {}  # key -> (offset, now_ms) of a new head in flight

    @classmethod
    def rebuild(
        cls,
        config: KeyOrdering,
        records: Iterable[KeyStateRecord],
        *,
        source: str,
        partition: int,
        followers_in_source: bool = False,
    ) -> tuple[SourceChains, list[Closed]]:
        """The state a new owner of the partition starts from, from the key-state records of its partition in
        the order they were read (compacted or not: a later record of a key wins, as compaction keeps it), and
        the tombstones to write for chains the records show closed (and for waiting records a chain no longer
        needs)."""
        chains = cls(config, source=source, partition=partition, followers_in_source=followers_in_source)
        latest: dict[bytes, Chain | None] = {}
        waiting: dict[bytes, dict[int, int]] = {}  # key -> offset -> since
        for record in records:
            if not chains._ours(record.chain):
                continue
            key = record.chain.key
            if isinstance(record, Passage):
                chains._remember(record)
            elif isinstance(record, Chain):
                latest[key] = record
            elif isinstance(record, Waiting):
                waiting.setdefault(key, {})[record.offset] = record.since_ms
            elif record.waiting is not None:
                waiting.get(key, {}).pop(record.waiting, None)
            elif record.closes_chain:
                latest[key] = None
                chains._passages.pop(key, None)  # facts about the closed chain's records, as `_close` drops them
                chains._settled.pop(key, None)
                chains._settled_fate.pop(key, None)
            elif record.tier is not None and record.seen is not None:
                chains._passages.get(key, {}).pop((record.tier, record.seen), None)
        closed: list[Closed] = []
        for key, chain in latest.items():
            if chain is None:
                continue
            state = chains._open[key] = _Open(
                chain.head, chain.frontier, chain.at_tier, chain.followers, chain.since_ms
            )
            kept = waiting.pop(key, {})
            state.waiting = sorted(o for o in kept if o > chain.frontier)
            closed += [Closed(chain=chain.chain, waiting=o) for o in sorted(kept) if o <= chain.frontier]
            if chain.settled is not None:
                state.settled_here = chain.settled
            if chains._chase(key, state):
                closed.append(chains._close(key))
        for key, kept in waiting.items():  # no open chain: nothing waits behind anything (see `_close`)
            closed += [Closed(chain=ChainKey(source, partition, key), waiting=o) for o in sorted(kept)]
        for key in [k for k in chains._passages if k not in chains._open]:
            del chains._passages[key]
        chains._settled = {k: v for k, v in chains._settled.items() if k in chains._open}
        chains._settled_fate = {k: v for k, v in chains._settled_fate.items() if k in chains._open}
        return chains, closed

    def blocked(self) -> int:
        """How many keys of this partition are blocked (open chains)."""
        return len(self._open)

    def room(self) -> int:
        """How many more chains may open before `max_blocked_keys` (a head whose hop is in flight counts): a
        batch call admits its records before any of them fails, so it holds at most this many."""
        return self.config.max_blocked_keys - len(self._open) - len(self._starting)

    def chain(self, key: bytes) -> Chain | None:
        """The open chain of `key` (a `key_id`), as it would be written."""
        state = self._open.get(key)
        return None if state is None else self._record(key, state)

    def admit(self, key: bytes | None) -> Admission:
        """What to do with the next source record of key `key` (a `key_id`; None: no key, never ordered)."""
        if key is None:
            return _HANDLE
        state = self._open.get(key)
        if state is None:
            if key in self._starting:
                return _WAIT
            return _PAUSE if len(self._open) + len(self._starting) >= self.config.max_blocked_keys else _HANDLE
        if self.followers_in_source:
            return _KEEP
        if state.pending is not None:
            return _WAIT
        return Admission(Admit.FOLLOW, state.at_tier, state.frontier)

    def kept(self, key: bytes, offset: int, *, now_ms: int) -> list[KeyStateRecord]:
        """The record at `offset` (admitted `Admit.KEEP`) stays in the source: returns the `Waiting` record to
        write before its offset is finished (none for a copy read again after a restart: it is waiting, or was
        released, already)."""
        state = self._open[key]
        if offset <= state.frontier or offset in state.waiting or offset == state.pending:
            return []
        insort(state.waiting, offset)
        return [Waiting(chain=ChainKey(self.source, self.partition, key), offset=offset, since_ms=now_ms)]

    def releases(self) -> list[Release]:
        """The followers kept in the source that may run now, one per chain (the first waiting, once everything
        before it is terminal and nothing of its chain is in flight), in no particular order of keys. The same
        release is returned until `released` is told it is taken."""
        out: list[Release] = []
        for key, state in self._open.items():
            if state.waiting and state.pending is None and state.releasing is None and self._front_settled(key, state):
                fate = state.settled_here or self._settled_fate.get(key)
                dead = fate is Fate.DEAD_LETTERED and self.config.dead_head is DeadHeadPolicy.DEAD_LETTER
                out.append(Release(key, state.waiting[0], dead))
        return out

    def released(self, key: bytes, offset: int) -> None:
        """`Release(key, offset)` is being read again and handled: it is not returned again."""
        state = self._open.get(key)
        if state is not None and state.waiting and state.waiting[0] == offset:
            state.releasing = offset

    def succeeded(self, key: bytes, offset: int) -> list[KeyStateRecord]:
        """Released follower `offset` was handled successfully here (a failure or a dead letter goes through
        `handed_off` and `acked`): returns the records to write (its waiting record's tombstone, and its chain
        record or, when no follower waits any more, the chain's tombstone)."""
        state = self._open.get(key)
        if state is None or state.releasing != offset:
            return []
        state.releasing = None
        return self._moved_front(key, state, offset, landed=None, fate=Fate.SUCCEEDED)

    def _moved_front(
        self, key: bytes, state: _Open, offset: int, *, landed: int | None, fate: Fate | None
    ) -> list[KeyStateRecord]:
        """Released follower `offset` is the chain's front now: in tier `landed`, or settled here (`fate`)."""
        chain = ChainKey(self.source, self.partition, key)
        state.waiting.remove(offset)
        state.frontier, state.followers, state.settled_here = offset, state.followers + 1, fate
        if landed is not None:
            state.at_tier = landed
        state.anchor = (state.at_tier, state.frontier)
        done = Closed(chain=chain, waiting=offset)
        if fate is not None and not state.waiting:
            return [done, self._close(key)]
        return [self._record(key, state), done]

    def _front_settled(self, key: bytes, state: _Open) -> bool:
        return state.settled_here is not None or self._settled.get(key, -1) >= state.anchor[1]

    def handed_off(self, key: bytes, offset: int, *, now_ms: int) -> None:
        """The record at `offset` was produced to a tier or the DLQ: a failed record of an unblocked key (a new
        head, or dead-lettered at once) or a follower (`Admit.FOLLOW`). Until `acked`, the key's next record
        waits: it may be handled only once this one is durably where it goes."""
        state = self._open.get(key)
        if state is None:
            self._starting[key] = (offset, now_ms)
        else:
            state.pending = offset

    def acked(self, key: bytes, offset: int, *, landed: int | None) -> list[KeyStateRecord]:
        """The hand-off of `offset` was acknowledged in tier `landed` (None: in the DLQ, routed there or
        refused by its tier as too large). Returns the key-state records to write before committing past
        `offset` (or, for a released follower, before its chain goes on)."""
        state = self._open.get(key)
        if state is None:
            start = self._starting.get(key)
            if start is None or start[0] != offset:
                return []
            del self._starting[key]
            if landed is None:  # a head dead-lettered at once is terminal: no chain
                self._passages.pop(key, None)
                self._settled.pop(key, None)
                self._settled_fate.pop(key, None)
                return []
            state = self._open[key] = _Open(offset, offset, landed, 0, start[1])
        elif state.releasing == offset:  # a released follower failed: it is the chain's front now
            state.releasing = state.pending = None
            fate = Fate.DEAD_LETTERED if landed is None else None
            return self._moved_front(key, state, offset, landed=landed, fate=fate)
        elif state.pending != offset:
            return []
        else:
            state.pending = None
            if landed is not None:
                state.frontier, state.at_tier, state.followers = offset, landed, state.followers + 1
                state.anchor = (landed, offset)
            # else: dropped on its way (in the DLQ unhandled); the next follower waits behind the same record
        if self._chase(key, state):
            return [self._close(key)]
        if landed is None:
            return []
        state.anchor = (state.at_tier, state.frontier)
        return [self._record(key, state)]

    def learn(self, record: KeyStateRecord) -> Closed | None:
        """Apply a key-state record of this partition read live (tiers' passages and their tombstones; chain
        records are this instance's own). Returns the tombstone to write when the key is no longer blocked."""
        if isinstance(record, Chain | Waiting) or not self._ours(record.chain):
            return None
        key = record.chain.key
        state = self._open.get(key)
        if state is None and key not in self._starting:
            return None  # about a chain closed already
        if isinstance(record, Closed):
            if record.tier is not None and record.seen is not None:
                self._passages.get(key, {}).pop((record.tier, record.seen), None)
            return None
        self._remember(record)
        return self._close(key) if state is not None and self._chase(key, state) else None

    def _remember(self, passage: Passage) -> None:
        key = passage.chain.key
        self._passages.setdefault(key, {})[(passage.tier, passage.seen)] = passage
        if passage.fate is not Fate.SENT and passage.seen >= self._settled.get(key, -1):
            self._settled[key] = passage.seen
            self._settled_fate[key] = passage.fate

    def _ours(self, chain: ChainKey) -> bool:
        return chain.source_topic == self.source and chain.source_partition == self.partition

    def _chase(self, key: bytes, state: _Open) -> bool:
        """Follow the passages of the frontier from where the chain record last put it; True when they show it
        terminal (and no follower is in flight, and none waits in the source: `releases` runs it). A record settled at or after the frontier settles it
        (everything before a handled record is terminal), whichever tier says so: a tier forgets its passages
        below one it settled. A record can visit a tier twice, so the walk stops before a position it has been
        at: any tier on the record's path is a good place to send a follower (that tier forwards it), and
        walking from the recorded position makes a rebuilt state decide as the live one."""
        if self._front_settled(key, state):
            if state.waiting:  # it goes on: where the front went, as a live state that read each passage knows
                state.at_tier = self._last_tier(key, state.anchor)
            return state.pending is None and state.releasing is None and not state.waiting
        passages = self._passages.get(key, {})
        position, visited = state.anchor, {state.anchor}
        while (passage := passages.get(position)) is not None:
            if passage.fate is not Fate.SENT or passage.to_tier is None or passage.after is None:
                return state.pending is None and not state.waiting
            if (passage.to_tier, passage.after) in visited:
                break
            position = (passage.to_tier, passage.after)
            visited.add(position)
            if self._settled.get(key, -1) >= position[1]:
                return state.pending is None and not state.waiting
        state.at_tier, state.frontier = position
        return False

    def _last_tier(self, key: bytes, start: tuple[int, int]) -> int:
        """The tier the `sent` passages from `start` lead to (stopping before a position visited already)."""
        passages = self._passages.get(key, {})
        position, visited = start, {start}
        while (passage := passages.get(position)) is not None and passage.to_tier is not None:
            assert passage.after is not None
            if (passage.to_tier, passage.after) in visited:
                break
            position = (passage.to_tier, passage.after)
            visited.add(position)
        return position[0]

    def _close(self, key: bytes) -> Closed:
        del self._open[key]
        self._passages.pop(key, None)
        self._settled.pop(key, None)
        self._settled_fate.pop(key, None)
        return Closed(chain=ChainKey(self.source, self.partition, key))

    def _record(self, key: bytes, state: _Open) -> Chain:
        return Chain(
            chain=ChainKey(self.source, self.partition, key),
            head=state.head,
            frontier=state.frontier,
            at_tier=state.at_tier,
            followers=state.followers,
            since_ms=state.since_ms,
            settled=state.settled_here,
        )
