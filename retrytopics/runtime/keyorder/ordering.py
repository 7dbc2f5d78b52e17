"""Key order in a consumer loop (docs/key-ordering.md, section 4): which records of a key-ordered handler may be
handled now, which follow their key's predecessor into a tier, and which stop their partition.

A main consumer (`KeyOrder`) holds one `SourceChains` (retrytopics/core/keyorder/source_chains.py, pure) per
assigned source partition of an ordered handler:

- at assignment (`assigned`, inside the rebalance callback) it is rebuilt from the partition's key-state
  records, read to their end; a partition whose read failed is not started (held, read again each poll,
  unhealthy, one ERROR line) until the read succeeds: starting without it could run a blocked key's record
  before its head;
- before each handler call (`admit`, asked by the admission step, runtime/keyorder/stage.py, for a record of an
  ordered handler only);
- a record whose key's last hop is not acknowledged yet (`Admit.WAIT`) is parked (`park`): kept in memory, its
  offset tracked unfinished by the hand-off, while the partition's records of other keys go on; every later
  record of its key is parked behind it; each poll, the first parked record of each key whose hop is
  acknowledged meanwhile is taken back (`unpark`) and admitted again. Past `PARKED_PER_PARTITION` parked
  records, or at `max_blocked_keys`, the partition stops at the record (`holds`) and reads it again later;
- around every hand-off of such a record (`handed_off`, `acked`: the hand-off, runtime/handoff/ordered.py);
- every poll (`learn`): the tiers' passages of its partitions, read by an assign()-only reader (`KeyStateFeed`).

A tier consumer (`TierOrder`) holds one `TierPassages` per ordered tier topic, rebuilt at assignment from every
partition of the key-state topic (read the same way, a failed read holds its partitions). It is asked about
each retried record before its handler (`on_retry`) and about each follower when it is read (`on_follower`).

Both are told of every hand-off and success of an ordered record (`sent`, `acked`, `succeeded`: the hand-off,
runtime/handoff/ordered.py). What they return are key-state records for the hand-off to write: a record's
offset is finished only once its key-state records are acknowledged too (write before commit). Nothing here
publishes or commits.
"""

from __future__ import annotations

import logging
from bisect import insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.keyorder.follower import Follower
from retrytopics.core.keyorder.hops import Origin
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.source_chains import Admission, Admit, SourceChains
from retrytopics.core.keyorder.state_records import Chain, Closed, KeyStateRecord
from retrytopics.core.keyorder.tier_passages import Step, TierDecision, TierPassages
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.signing import HeaderKeys
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.keyorder.key_state import KeyState, KeyStateReader, Skipped, decode_message, read_key_state
from retrytopics.runtime.records.calls import Binding

__all__ = ["KeyOrder", "KeyStateFeed", "TierOrder"]

log = logging.getLogger("retrytopics.runtime")

#: how long a read of a key-state topic at assignment may take before the partition stays unstarted
_READ_TIMEOUT_S = 30.0
#: how often a failed read at assignment is tried again (loop clock, seconds)
_REREAD_EVERY_S = 1.0
#: the most records of one source partition kept in memory behind their keys' unacknowledged hops: past it
#: the partition stops at the next such record (one poll's worth, so memory stays bounded by what was fetched)
PARKED_PER_PARTITION = 1_000

_NOT_STARTED = Admission(Admit.WAIT)


class KeyStateFeed(Protocol):
    """An assign()-only, read_committed reader of key-state partitions, read as they grow (no group, no
    commits): `ClientFactory.key_state_feed`."""

    def add(self, topic: str, starts: Mapping[int, int]) -> None:
        """Read these partitions of `topic` from these offsets on (-2: from the first record kept)."""

    def remove(self, topic: str, partitions: Sequence[int]) -> None: ...

    def poll(self) -> list[Message]:
        """The records read since the last call, without waiting."""

    def close(self) -> None: ...


class _Ordering:
    """What both kinds share: the ordered handlers of the loop, the reads at assignment (a partition whose key
    state is not read stays held), and the partitions stopped at a record."""

    def __init__(
        self,
        ordered: Mapping[str, Binding],
        *,
        read: KeyStateReader,
        emitter: Emitter,
        name: str,
        now_ms: Callable[[], int],
        monotonic: Callable[[], float],
    ) -> None:
        self._ordered = dict(ordered)  # this loop's topic (a source, or a tier) -> its ordered binding
        self._read = read
        self._emitter = emitter
        self._name = name
        self._now_ms = now_ms
        self._monotonic = monotonic
        self._unread: dict[TopicPartition, float] = {}  # assigned, key state not read yet -> when to try again
        self._failed_reads: set[TopicPartition] = set()  # one ERROR line per partition and episode

    def ordered(self, topic: str) -> bool:
        return topic in self._ordered

    def state_topic(self, source: str) -> str:
        """The key-state topic of ordered source topic `source`."""
        return next(b for b in self._ordered.values() if b.topic == source).ctx.topics.key_state_topic

    def state_keys(self, source: str) -> HeaderKeys | None:
        """The keys that sign the key-state records of ordered source topic `source` (None: unsigned)."""
        return next(b for b in self._ordered.values() if b.topic == source).ctx.header_keys

    @property
    def not_started(self) -> int:
        """Ordered partitions whose key state is not read yet (the loop is unhealthy meanwhile)."""
        return len(self._unread)

    def assigned(self, tps: Iterable[TopicPartition]) -> list[KeyStateRecord]:
        """Rebuild the key state of the ordered partitions among `tps`; returns the tombstones to write."""
        for tp in tps:
            if tp[0] in self._ordered:
                self._unread[tp] = self._monotonic()
        return self.read_pending()

    def read_pending(self) -> list[KeyStateRecord]:
        """Read the key state of the partitions not started yet whose next attempt is due."""
        now = self._monotonic()
        due: dict[str, list[int]] = {}
        for tp, at in self._unread.items():
            if at <= now:
                due.setdefault(tp[0], []).append(tp[1])
        out: list[KeyStateRecord] = []
        for topic, partitions in due.items():
            binding = self._ordered[topic]
            state_topic = binding.ctx.topics.key_state_topic
            try:
                state = read_key_state(
                    self._read,
                    state_topic,
                    self._state_partitions(partitions),
                    timeout_s=_READ_TIMEOUT_S,
                    keys=binding.ctx.header_keys,
                )
            except KafkaClientError as exc:
                self._read_failed(topic, partitions, state_topic, exc)
                continue
            if state.malformed or state.forged:
                self._emit(Event.KEY_STATE_REFUSED, topic=state_topic, malformed=state.malformed, forged=state.forged)
            for p in partitions:
                del self._unread[(topic, p)]
                self._failed_reads.discard((topic, p))
            out += self._rebuilt(topic, sorted(partitions), state)
        return out

    def _state_partitions(self, partitions: list[int]) -> list[int] | None:
        raise NotImplementedError

    def _rebuilt(self, topic: str, partitions: list[int], state: KeyState) -> list[KeyStateRecord]:
        raise NotImplementedError

    def _read_failed(self, topic: str, partitions: list[int], state_topic: str, exc: KafkaClientError) -> None:
        retry_at = self._monotonic() + _REREAD_EVERY_S
        for p in partitions:
            self._unread[(topic, p)] = retry_at
            if (topic, p) not in self._failed_reads:
                self._failed_reads.add((topic, p))
                log.error(
                    "%s: %s[%d] not started: its key state (%s) could not be read (%s); trying again",
                    self._name,
                    topic,
                    p,
                    state_topic,
                    exc,
                )

    def learn(self) -> list[KeyStateRecord]:
        return []

    def close(self) -> None:
        return None

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self._name, **data)


class KeyOrder(_Ordering):
    """The key order of one main consumer's ordered handlers (see the module docstring)."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        *,
        read: KeyStateReader,
        feed: KeyStateFeed,
        emitter: Emitter,
        name: str,
        now_ms: Callable[[], int],
        monotonic: Callable[[], float],
        park_limit: int = PARKED_PER_PARTITION,
    ) -> None:
        ordered = {t: b for t, b in bindings.items() if b.ordering is not None and t == b.topic}
        super().__init__(ordered, read=read, emitter=emitter, name=name, now_ms=now_ms, monotonic=monotonic)
        #: parked records per partition before it stops instead; exactly-once parks none: records after a
        #: parked one would commit their outcomes in a transaction that an abort could then have to repeat
        self._park_limit = park_limit
        self._source_of = {b.ctx.topics.key_state_topic: t for t, b in ordered.items()}
        self._feed = feed
        self._chains: dict[TopicPartition, SourceChains] = {}
        self._held: dict[TopicPartition, bytes] = {}  # partition stopped at a record of this key (a key id)
        self._at_bound: set[TopicPartition] = set()  # partitions paused at max_blocked_keys (one WARNING each)
        self._parked: dict[TopicPartition, list[Message]] = {}  # in offset order
        self._parked_keys: dict[TopicPartition, dict[bytes, int]] = {}  # key id -> how many of it are parked

    def admit(self, msg: Message, *, unparked: bool = False) -> Admission:
        """What to do with source record `msg` of an ordered handler before its handler runs; `unparked`: it
        was taken back by `unpark`, as the first parked record of its key."""
        chains = self._chains.get(msg.tp)
        if chains is None:
            return _NOT_STARTED
        key = None if msg.key is None else key_id(msg.key)
        parked = None if unparked else self._parked_keys.get(msg.tp)
        if parked and key in parked:
            return _BEHIND_PARKED  # an earlier record of its key waits in memory: this one goes behind it
        admission = chains.admit(key)
        if key is not None and admission.action is Admit.PAUSE:
            self._held[msg.tp] = key
            self._bound_reached(
                msg,
                "blocked_keys",
                f"{chains.blocked()} keys blocked, its max_blocked_keys; it resumes when a chain closes",
            )
        return admission

    def _bound_reached(self, msg: Message, bound: str, why: str) -> None:
        """`msg`'s partition stops at a bound: one WARNING line and one event per episode (until `holds` lets
        it go on)."""
        if msg.tp in self._at_bound:
            return
        self._at_bound.add(msg.tp)
        log.warning("%s: %s[%d] paused: %s", self._name, msg.topic, msg.partition, why)
        self._emit(Event.KEY_ORDER_BOUND_REACHED, topic=msg.topic, partition=msg.partition, bound=bound)

    def room(self, tp: TopicPartition) -> int:
        """How many more chains of `tp` may open (`SourceChains.room`); 0 before its key state is read."""
        chains = self._chains.get(tp)
        return 0 if chains is None else chains.room()

    def park(self, msg: Message, *, again: bool = False) -> bool:
        """Keep `msg` (admitted `Admit.WAIT`) in memory until its key may go on (`unpark`); False when its
        partition has its limit of parked records (`PARKED_PER_PARTITION`; none with exactly-once): the
        partition stops at `msg` instead (`holds`).
        `again`: a record taken back by `unpark` (it is parked whatever the bound: its offset is tracked and
        later records of its partition were acted on, so it is never read again from Kafka)."""
        tp, key = msg.tp, key_id(msg.key or b"")
        if tp not in self._chains:
            return False  # not started: held until its key state is read
        parked = self._parked.setdefault(tp, [])
        if not again and len(parked) >= self._park_limit:
            self._held[tp] = key
            self._bound_reached(
                msg,
                "parked",
                f"{len(parked)} records parked behind their keys' unacknowledged hops (its bound); it resumes as "
                "they are acknowledged",
            )
            return False
        insort(parked, msg, key=_offset)
        keys = self._parked_keys.setdefault(tp, {})
        keys[key] = keys.get(key, 0) + 1
        return True

    def unpark_dropped(self, msg: Message) -> None:
        """Forget parked `msg` whose `Parked` outcome was never acted on (the batch call it waited in was dropped,
        and it is read again from Kafka)."""
        parked = self._parked.get(msg.tp)
        if parked is None or msg not in parked:
            return
        parked.remove(msg)
        keys, key = self._parked_keys[msg.tp], key_id(msg.key or b"")
        keys[key] -= 1
        if not keys[key]:
            del keys[key]

    @property
    def parks(self) -> bool:
        """Whether records are parked."""
        return any(self._parked.values())

    def awaiting_acks(self) -> list[TopicPartition]:
        """The partitions with records waiting for an acknowledgement: parked ones."""
        return [tp for tp, parked in self._parked.items() if parked]

    def unpark(self, ready: Callable[[TopicPartition], bool]) -> list[Message]:
        """Take back, for the partitions `ready` says may go on, the first parked record of each key whose
        last hop is acknowledged: each is to be admitted again, in the order returned."""
        out: list[Message] = []
        for tp, parked in self._parked.items():
            if not parked or not ready(tp):
                continue
            chains, keys = self._chains[tp], self._parked_keys[tp]
            blocked: set[bytes] = set()
            kept: list[Message] = []
            for msg in parked:
                key = key_id(msg.key or b"")
                if key in blocked or chains.admit(key).action in _STOPPED:
                    kept.append(msg)
                else:
                    out.append(msg)
                    keys[key] -= 1
                    if not keys[key]:
                        del keys[key]
                blocked.add(key)  # a key's later records stay behind its first
            self._parked[tp] = kept
        return out

    def holds(self, tp: TopicPartition) -> bool:
        """Whether `tp` stays stopped: its key state is not read yet, or the record it stopped at may still not
        proceed."""
        if tp in self._unread:
            return True
        key = self._held.get(tp)
        if key is None:
            return False
        chains = self._chains.get(tp)
        action = None if chains is None else chains.admit(key).action
        parked = self._parked.get(tp)
        if action is Admit.WAIT or action is Admit.PAUSE or (parked and len(parked) >= self._park_limit):
            return True
        del self._held[tp]
        self._at_bound.discard(tp)
        return False

    def sent(
        self, at: Origin, *, to_tier: int | None, handled: bool, behind: int | None = None
    ) -> list[KeyStateRecord]:
        """A hop of the record `at` is being produced (a failure's, or a follower's): its key waits for it."""
        chains = self._chains.get((at.chain.source_topic, at.chain.source_partition))
        if chains is not None:
            chains.handed_off(at.chain.key, at.offset, now_ms=self._now_ms())
        return []

    def acked(self, at: Origin, landed: int | None) -> list[KeyStateRecord]:
        """The hop of `at` is acknowledged in tier `landed` (None: the DLQ): the key-state record to write before
        its offset is finished, if any."""
        tp = (at.chain.source_topic, at.chain.source_partition)
        chains = self._chains.get(tp)
        if chains is None:
            return []
        records = chains.acked(at.chain.key, at.offset, landed=landed)
        for record in records:
            if isinstance(record, Closed) and record.closes_chain:
                self._closed(tp)
            elif isinstance(record, Chain) and record.head == at.offset:  # a chain opened: its key is blocked
                self._emit(Event.KEY_ORDER_BLOCKED, topic=tp[0], partition=tp[1], blocked_keys=chains.blocked())
        return records

    def succeeded(self, at: Origin) -> list[KeyStateRecord]:
        return []  # a source record handled here opens nothing

    def _state_partitions(self, partitions: list[int]) -> list[int] | None:
        return partitions  # everything about a source partition's chains is in its partition of the topic

    def _rebuilt(self, topic: str, partitions: list[int], state: KeyState) -> list[KeyStateRecord]:
        binding = self._ordered[topic]
        assert binding.ordering is not None
        out: list[KeyStateRecord] = []
        for p in partitions:
            chains, closed = SourceChains.rebuild(binding.ordering, state.records, source=topic, partition=p)
            self._chains[(topic, p)] = chains
            out += closed
        self._feed.add(binding.ctx.topics.key_state_topic, {p: state.next_offsets.get(p, -2) for p in partitions})
        return out

    def revoked(self, tps: Iterable[TopicPartition]) -> None:
        """Forget the state of `tps` (revoked or lost: their next owner rebuilds it)."""
        dropped: dict[str, list[int]] = {}
        for tp in tps:
            if tp[0] not in self._ordered:
                continue
            self._unread.pop(tp, None)
            self._held.pop(tp, None)
            self._parked.pop(tp, None)  # its next owner reads them again from the committed offset
            self._parked_keys.pop(tp, None)
            self._at_bound.discard(tp)
            if self._chains.pop(tp, None) is not None:
                dropped.setdefault(self._ordered[tp[0]].ctx.topics.key_state_topic, []).append(tp[1])
        for state_topic, partitions in dropped.items():
            self._feed.remove(state_topic, partitions)

    def learn(self) -> list[KeyStateRecord]:
        """Apply the passages the feed read since the last poll; returns the tombstones of closed chains."""
        out: list[KeyStateRecord] = []
        for msg in self._feed.poll():
            source = self._source_of.get(msg.topic)
            if source is None or (chains := self._chains.get((source, msg.partition))) is None:
                continue
            record = decode_message(msg, self._ordered[source].ctx.header_keys)
            if isinstance(record, Skipped):
                log.warning("%s: a key-state record of %s skipped (%s)", self._name, msg.topic, record.reason)
                self._emit(
                    Event.KEY_STATE_REFUSED,
                    topic=msg.topic,
                    malformed=int(not record.forged),
                    forged=int(record.forged),
                )
                continue
            closed = chains.learn(record)
            if closed is not None:
                out.append(closed)
                self._closed((source, msg.partition))
        return out

    def blocked_keys(self) -> dict[TopicPartition, int]:
        """Open chains per assigned ordered partition (the `key_order.blocked_keys` gauge)."""
        return {tp: chains.blocked() for tp, chains in self._chains.items()}

    def close(self) -> None:
        self._feed.close()

    def _closed(self, tp: TopicPartition) -> None:
        chains = self._chains[tp]
        self._emit(Event.KEY_ORDER_RELEASED, topic=tp[0], partition=tp[1], blocked_keys=chains.blocked())


class TierOrder(_Ordering):
    """The key order of one tier consumer's ordered handlers (see the module docstring)."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        *,
        read: KeyStateReader,
        emitter: Emitter,
        name: str,
        now_ms: Callable[[], int],
        monotonic: Callable[[], float],
    ) -> None:
        ordered = {t: b for t, b in bindings.items() if b.ordering is not None and t != b.topic}
        super().__init__(ordered, read=read, emitter=emitter, name=name, now_ms=now_ms, monotonic=monotonic)
        self._passages: dict[str, TierPassages] = {}  # tier topic -> what its consumer knows

    def on_retry(self, msg: Message, state: RetryHeaders) -> TierDecision:
        """Whether retried record `msg` (a key, retry state `state`) may be handled now."""
        passages = self._passages.get(msg.topic)
        if passages is None or msg.key is None:
            return _T_NOT_STARTED if passages is None else _T_HANDLE
        chain = ChainKey(state.original_topic, state.original_partition, key_id(msg.key))
        # WAIT: the record waits in memory, its partition goes on (runtime/keyorder/stage.py)
        return passages.on_retry(chain)

    def on_follower(self, msg: Message, follower: Follower) -> TierDecision:
        """What to do with follower `msg`."""
        passages = self._passages.get(msg.topic)
        if passages is None or msg.key is None:
            return _T_NOT_STARTED
        chain = ChainKey(follower.original_topic, follower.original_partition, key_id(msg.key))
        decision = passages.on_follower(chain, follower.original_offset, follower.after)
        if decision.step is Step.UNPROVEN:
            self._emit(Event.KEY_ORDER_UNPROVEN, topic=msg.topic, partition=msg.partition, offset=msg.offset)
        return decision

    def started(self, tp: TopicPartition) -> bool:
        """Whether the key state of tier partition `tp` is read: a record that waits for the acknowledgement of
        a hop of its chain (`Step.WAIT`) then waits in memory, asked again each poll, while the records fetched
        behind it stay queued (a stop would seek back and fetch them all again); before, its partition is held."""
        return tp[0] in self._passages and tp not in self._unread

    def awaiting_acks(self) -> list[TopicPartition]:
        """None: a tier's records that wait for an acknowledgement wait in memory, due one poll later."""
        return []

    def holds(self, tp: TopicPartition) -> bool:
        """Whether `tp` stays stopped: its key state is not read yet."""
        return tp in self._unread

    def sent(
        self, at: Origin, *, to_tier: int | None, handled: bool, behind: int | None = None
    ) -> list[KeyStateRecord]:
        """A hop of the record `at` read in this tier is being produced: after its handler ran (`handled`), as a
        follower forwarded behind `behind` (`to_tier`), or dead-lettered unhandled."""
        passages = self._tier_of(at)
        if passages is None:
            return []
        if handled:
            return passages.handled(at.chain, at.offset, to_tier=to_tier, dead_lettered=to_tier is None)
        if to_tier is None:
            return passages.dead_lettered(at.chain, at.offset)
        assert behind is not None
        return passages.forwarded(at.chain, at.offset, after=behind, to_tier=to_tier)

    def acked(self, at: Origin, landed: int | None) -> list[KeyStateRecord]:
        passages = self._tier_of(at)
        return [] if passages is None else passages.acked(at.chain, at.offset, landed=landed)

    def succeeded(self, at: Origin) -> list[KeyStateRecord]:
        passages = self._tier_of(at)
        return [] if passages is None else passages.handled(at.chain, at.offset, to_tier=None)

    def _tier_of(self, at: Origin) -> TierPassages | None:
        # a tier consumer consumes one tier topic: the passages of the one ordered tier of that chain's source
        for topic, binding in self._ordered.items():
            if binding.topic == at.chain.source_topic:
                return self._passages.get(topic)
        return None

    def _state_partitions(self, partitions: list[int]) -> list[int] | None:
        return None  # a tier partition holds records of every source partition: its passages are anywhere

    def _rebuilt(self, topic: str, partitions: list[int], state: KeyState) -> list[KeyStateRecord]:
        # Rebuilt whole at each assignment: another member may have written passages of this tier meanwhile (an
        # eager rebalance revokes everything first, and a revoke acknowledges what is in flight)
        binding = self._ordered[topic]
        assert binding.ordering is not None
        tier = binding.ctx.topics.tier_by_topic(topic)
        assert tier is not None
        passages, stale = TierPassages.rebuild(binding.ordering, state.records, tier=tier.index)
        self._passages[topic] = passages
        return list(stale)

    def revoked(self, tps: Iterable[TopicPartition]) -> None:
        """Forget what was held for `tps`; what the tier knows stays until none of its partitions is assigned."""
        for tp in tps:
            self._unread.pop(tp, None)


_BEHIND_PARKED = Admission(Admit.WAIT)
_STOPPED = (Admit.WAIT, Admit.PAUSE)
_T_NOT_STARTED = TierDecision(Step.WAIT)
_T_HANDLE = TierDecision(Step.HANDLE)


def _offset(msg: Message) -> int:
    return msg.offset
