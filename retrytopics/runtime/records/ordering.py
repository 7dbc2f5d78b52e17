"""Key order on a main consumer (docs/key-ordering.md, section 4): which source records of a key-ordered handler
may be handled now, which follow their key's predecessor into a tier, and which stop their partition.

One `SourceChains` (retrytopics/core/key_order.py, pure) per assigned source partition of an ordered handler:

- at assignment (`assigned`, inside the rebalance callback) it is rebuilt from the partition's key-state
  records, read to their end; a partition whose read failed is not started (held, read again each poll,
  unhealthy, one ERROR line) until the read succeeds: starting without it could run a blocked key's record
  before its head;
- before each handler call (`admit`, asked by the records stage for a record of an ordered handler only);
- around every hand-off of such a record (`handed_off`, `acked`: the hand-off, runtime/handoff/ordered.py);
- every poll (`learn`): the tiers' passages of its partitions, read by an assign()-only reader (`KeyStateFeed`).

What `acked` and `learn` return are key-state records for the hand-off to write: a record's source offset is
finished only once its key-state record is acknowledged too (write before commit). Nothing here publishes or
commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from retrytopics.core.errors import KafkaClientError
from retrytopics.core.key_order import Admission, Admit, Chain, Closed, KeyStateRecord, SourceChains, key_id
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.key_state import KeyStateReader, decode_message, read_key_state

__all__ = ["KeyOrder", "KeyStateFeed"]

log = logging.getLogger("retrytopics.runtime")

#: how long a read of a key-state topic at assignment may take before the partition stays unstarted
_READ_TIMEOUT_S = 30.0
#: how often a failed read at assignment is tried again (loop clock, seconds)
_REREAD_EVERY_S = 1.0

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


class KeyOrder:
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
    ) -> None:
        self._ordered = {t: b for t, b in bindings.items() if b.ordering is not None and t == b.topic}
        self._source_of = {b.ctx.topics.key_state_topic: t for t, b in self._ordered.items()}
        self._read = read
        self._feed = feed
        self._emitter = emitter
        self._name = name
        self._now_ms = now_ms
        self._monotonic = monotonic
        self._chains: dict[TopicPartition, SourceChains] = {}
        self._unread: dict[TopicPartition, float] = {}  # assigned, key state not read yet -> when to try again
        self._held: dict[TopicPartition, bytes] = {}  # partition stopped at a record of this key (a key id)
        self._at_bound: set[TopicPartition] = set()  # partitions paused at max_blocked_keys (one WARNING each)
        self._failed_reads: set[TopicPartition] = set()  # one ERROR line per partition and episode

    # -- what the stage and the hand-off ask -----------------------------------------------------------------

    def ordered(self, topic: str) -> bool:
        return topic in self._ordered

    def state_topic(self, source: str) -> str:
        """The key-state topic of ordered source topic `source`."""
        return self._ordered[source].ctx.topics.key_state_topic

    def admit(self, msg: Message) -> Admission:
        """What to do with source record `msg` of an ordered handler before its handler runs."""
        chains = self._chains.get(msg.tp)
        if chains is None:
            return _NOT_STARTED
        key = None if msg.key is None else key_id(msg.key)
        admission = chains.admit(key)
        if key is not None and (admission.action is Admit.WAIT or admission.action is Admit.PAUSE):
            self._held[msg.tp] = key
            if admission.action is Admit.PAUSE and msg.tp not in self._at_bound:
                self._at_bound.add(msg.tp)
                log.warning(
                    "%s: %s[%d] paused: %d keys blocked, its max_blocked_keys; it resumes when a chain closes",
                    self._name,
                    msg.topic,
                    msg.partition,
                    chains.blocked(),
                )
                self._emit(Event.KEY_ORDER_BOUND_REACHED, topic=msg.topic, partition=msg.partition)
        return admission

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
        if action is Admit.WAIT or action is Admit.PAUSE:
            return True
        del self._held[tp]
        self._at_bound.discard(tp)
        return False

    def handed_off(self, msg: Message) -> None:
        """`msg` (a record of an ordered handler) is being produced to a tier or the DLQ."""
        chains = self._chains.get(msg.tp)
        if chains is not None and msg.key is not None:
            chains.handed_off(key_id(msg.key), msg.offset, now_ms=self._now_ms())

    def acked(self, tp: TopicPartition, offset: int, key: bytes | None, landed: int | None) -> KeyStateRecord | None:
        """The hand-off of `tp`@`offset` (record key `key`) is acknowledged in tier `landed` (None: the DLQ):
        the key-state record to write before its offset is finished, if any."""
        chains = self._chains.get(tp)
        if chains is None or key is None:
            return None
        record = chains.acked(key_id(key), offset, landed=landed)
        if isinstance(record, Closed):
            self._closed(tp)
        elif isinstance(record, Chain) and record.head == offset:  # a chain opened: its key is blocked
            self._emit(Event.KEY_ORDER_BLOCKED, topic=tp[0], partition=tp[1], blocked_keys=chains.blocked())
        return record

    # -- assignment -------------------------------------------------------------------------------------------

    def assigned(self, tps: Iterable[TopicPartition]) -> list[KeyStateRecord]:
        """Rebuild the key state of the ordered partitions among `tps`; returns the tombstones to write."""
        ordered = [tp for tp in tps if tp[0] in self._ordered]
        for tp in ordered:
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
            out += self._rebuild(topic, sorted(partitions))
        return out

    def _rebuild(self, topic: str, partitions: list[int]) -> list[KeyStateRecord]:
        binding = self._ordered[topic]
        state_topic = binding.ctx.topics.key_state_topic
        assert binding.ordering is not None
        try:
            state = read_key_state(self._read, state_topic, partitions, timeout_s=_READ_TIMEOUT_S)
        except KafkaClientError as exc:
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
            return []
        out: list[KeyStateRecord] = []
        for p in partitions:
            chains, closed = SourceChains.rebuild(binding.ordering, state.records, source=topic, partition=p)
            self._chains[(topic, p)] = chains
            del self._unread[(topic, p)]
            self._failed_reads.discard((topic, p))
            out += closed
        self._feed.add(state_topic, {p: state.next_offsets.get(p, -2) for p in partitions})
        return out

    def revoked(self, tps: Iterable[TopicPartition]) -> None:
        """Forget the state of `tps` (revoked or lost: their next owner rebuilds it)."""
        dropped: dict[str, list[int]] = {}
        for tp in tps:
            if tp[0] not in self._ordered:
                continue
            self._unread.pop(tp, None)
            self._held.pop(tp, None)
            self._at_bound.discard(tp)
            if self._chains.pop(tp, None) is not None:
                dropped.setdefault(self._ordered[tp[0]].ctx.topics.key_state_topic, []).append(tp[1])
        for state_topic, partitions in dropped.items():
            self._feed.remove(state_topic, partitions)

    # -- every poll -------------------------------------------------------------------------------------------

    def learn(self) -> list[KeyStateRecord]:
        """Apply the passages the feed read since the last poll; returns the tombstones of closed chains."""
        out: list[KeyStateRecord] = []
        for msg in self._feed.poll():
            source = self._source_of.get(msg.topic)
            if source is None or (chains := self._chains.get((source, msg.partition))) is None:
                continue
            record = decode_message(msg)
            if isinstance(record, str):
                log.warning("%s: a key-state record of %s skipped as malformed (%s)", self._name, msg.topic, record)
                continue
            closed = chains.learn(record)
            if closed is not None:
                out.append(closed)
                self._closed((source, msg.partition))
        return out

    def blocked_keys(self) -> dict[TopicPartition, int]:
        """Open chains per assigned ordered partition (the `key_order.blocked_keys` gauge)."""
        return {tp: chains.blocked() for tp, chains in self._chains.items()}

    @property
    def not_started(self) -> int:
        """Ordered partitions whose key state is not read yet (the loop is unhealthy meanwhile)."""
        return len(self._unread)

    def close(self) -> None:
        self._feed.close()

    def _closed(self, tp: TopicPartition) -> None:
        chains = self._chains[tp]
        self._emit(Event.KEY_ORDER_RELEASED, topic=tp[0], partition=tp[1], blocked_keys=chains.blocked())

    def _emit(self, event: Event, **data: object) -> None:
        self._emitter.emit(event, consumer=self._name, **data)
