"""Waiting, for tier consumers: head-of-line pausing pause a partition whose head record is not due, seek back to
it, resume it when due — and, for records due within a short horizon, wait in memory instead.

Every record in a tier topic waits the same delay, so due times are ordered within a partition (up to jitter,
see docs/architecture.md): when the head record is not due, nothing behind it is, and pausing the partition
costs nothing. The consumer keeps polling other partitions (and heartbeating), sleeping in `consume()` no
longer than the next due time: CPU stays near zero while every partition waits.

**Waiting in memory.** Seeking back discards what the client already fetched, so the record is fetched
again on resume: one broker round trip of lateness per pause, paid over and over when records fall due
back to back. A record due within `ahead_ms` therefore waits in a small per-partition queue instead, with
every later record of its partition behind it (offset order is kept). The partition keeps fetching while
the queue is short and the records it holds are due within the horizon; past `max_records`, or behind a
record due beyond the horizon, the partition is paused (without a seek, so nothing fetched is lost) and
resumes from the record after the queue's tail. A queued record is not tracked as an offset until it is
handled, so commits never pass it; a revoked partition's queue is dropped and its new owner reads it again.
Long waits still happen in Kafka: a queue head that is not due within the horizon is sought back to and
paused as above. A partition paused in Kafka resumes half the horizon before its head is due, so that the
fetch round trip and the decoding of a large fetch are over when the head falls due.

The same mechanism *holds* a source partition while a publish for it is failing, so that a broker outage
does not pile up records in memory. Pausing is normal operation: it is logged at DEBUG only.

**A bounded wait.** A record never waits longer than its tier's longest delay (delay × (1 + jitter)) after
this consumer first saw it not due (`bounded_due`, by the rule in retrytopics/core/due.py): the due time used is
min(`retry.due_at`, first seen + longest). A record the app wrote cannot trigger it on one clock (it was written after its failure, and is
due at most `longest` after that), so nothing runs early; under clock skew the wait becomes the tier's delay
in real elapsed time; and a forged due time (up to the clock-skew allowance ahead, which the header checks
accept) holds its partition for one tier delay, not a minute. Each clamp is a `due.clamped` event and a
warning: a sign of skewed clocks or of forged records.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterator

from retrytopics.core.dedupe import AuditKey
from retrytopics.core.due import bounded_due_ms
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import ConsumerPort, Message
from retrytopics.core.schedule import PauseSchedule
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.records.outcome import Queued

__all__ = ["PauseController"]

log = logging.getLogger("retrytopics.tiers")

_Entry = tuple[Message, int | None, Queued]


class PauseController:
    """Pauses, seeks and resumes partitions of one consumer; decides which fetched messages to act on; keeps
    the in-memory queues of records due soon (each entry: the message, its due time, and what was decided
    about it when it was read, `Queued`).

    After a seek back to offset X, messages of that partition still in flight from before the seek are
    stale: until X itself arrives, every message of the partition other than X is ignored.
    """

    def __init__(
        self, consumer: ConsumerPort, emitter: Emitter, *, consumer_name: str, ahead_ms: int = 0, max_records: int = 500
    ) -> None:
        self._consumer = consumer
        self._emitter = emitter
        self._name = consumer_name
        self.ahead_ms = ahead_ms  # how far ahead a record may wait in memory (retrytopics/core/step.py)
        self.max_records = max(1, max_records)
        self.schedule: PauseSchedule[TopicPartition] = PauseSchedule()
        self._awaiting: dict[TopicPartition, int] = {}  # partition -> the offset it was sought back to
        self._queues: dict[TopicPartition, deque[_Entry]] = {}
        #: the audit keys of queued records to be handled: a copy of one read meanwhile is a duplicate
        self._queued_keys: Counter[AuditKey] = Counter()
        self._next: dict[TopicPartition, int] = {}  # queued partition -> the offset after its queue's tail
        self._stopped: set[TopicPartition] = set()  # queued partitions not fetching (queue full or far tail)
        self._client_paused: set[TopicPartition] = set()  # what the consumer was told
        self._first_seen: dict[TopicPartition, dict[int, int]] = {}  # partition -> offset -> first seen not due
        self._heads: dict[TopicPartition, tuple[int, int]] = {}  # paused in Kafka -> (head offset, its due time)

    @property
    def paused(self) -> frozenset[TopicPartition]:
        """Partitions waiting for a record to fall due, in Kafka or in memory, or held."""
        return self.schedule.paused | frozenset(self._queues)

    def accepts_all(self, tp: TopicPartition) -> bool:
        """Whether `accept` is True for every record of `tp` now (it is fetched, and no seek waits)."""
        return tp not in self._next and tp not in self._awaiting and not self.schedule.is_paused(tp)

    def accept(self, msg: Message) -> bool:
        """Whether the loop should act on `msg` (its partition is not paused and it is not stale)."""
        tp = msg.tp
        if self.schedule.is_paused(tp):
            return False
        next_offset = self._next.get(tp)
        if next_offset is not None:
            return msg.offset >= next_offset  # an older copy of a queued record cannot come back; be sure
        target = self._awaiting.get(tp)
        if target is None:
            return True
        if msg.offset != target:
            return False
        del self._awaiting[tp]
        return True

    # -- how long ----------------------------------------------------------------------------------------

    def bounded_due(self, msg: Message, due_ms: int, longest_ms: int, now_ms: int) -> int:
        """`due_ms`, but no later than `longest_ms` after this consumer first saw `msg` (see the module
        docstring). Remembers first sightings per partition, at most `max_records` + 1 of them (the oldest
        offsets go first: records are acted on in offset order, so those are done)."""
        seen = self._first_seen.setdefault(msg.tp, {})
        first = seen.get(msg.offset)
        if first is None:
            first = seen[msg.offset] = now_ms
            while len(seen) > self.max_records + 1:
                del seen[min(seen)]
            if due_ms > now_ms + longest_ms:
                self._clamped(msg, due_ms, now_ms + longest_ms)
        return bounded_due_ms(due_ms, first_seen_ms=first, longest_ms=longest_ms)

    def _clamped(self, msg: Message, due_ms: int, bound_ms: int) -> None:
        log.warning(
            "%s: %s[%d]@%d is due %d ms later than its tier's longest delay allows; it waits until %d "
            "instead (skewed clocks or a forged retry.due_at)",
            self._name,
            msg.topic,
            msg.partition,
            msg.offset,
            due_ms - bound_ms,
            bound_ms,
        )
        self._emitter.emit(
            Event.DUE_CLAMPED,
            consumer=self._name,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            due_at=due_ms,
            clamped_to=bound_ms,
        )

    # -- waiting in Kafka --------------------------------------------------------------------------------

    def pause_until(self, tp: TopicPartition, offset: int, due_ms: int) -> None:
        """Pause `tp` until `due_ms`, to restart at `offset` (the head record, not due yet).

        With waiting in memory on, the partition resumes half the horizon early: the fetch and the decoding
        of what it brings happen before the head is due, and the head then waits in memory for its time."""
        self.schedule.pause_until(tp, due_ms=due_ms - self.ahead_ms // 2)
        self._park(tp, offset)
        self._heads[tp] = (offset, due_ms)
        log.debug("%s: paused %s[%d] at offset %d until %d", self._name, tp[0], tp[1], offset, due_ms)
        self._emitter.emit(Event.PARTITION_PAUSED, consumer=self._name, topic=tp[0], partition=tp[1], until=due_ms)

    def hold(self, tp: TopicPartition, offset: int | None) -> None:
        """Pause `tp` until `release(tp)`; restart at `offset` (None: where the consumer stands)."""
        self.schedule.hold(tp)
        if offset is not None:
            self._park(tp, offset)
        else:
            self._pause_client(tp)
        self._emitter.emit(Event.PARTITION_PAUSED, consumer=self._name, topic=tp[0], partition=tp[1], until=None)

    def _park(self, tp: TopicPartition, offset: int) -> None:
        self._pause_client(tp)
        self._awaiting[tp] = offset
        self._consumer.seek(tp, offset)

    def restart_at(self, tp: TopicPartition, offset: int) -> None:
        """Read `tp` again from `offset` (records the loop fetched but did not act on). A paused or already
        sought-back partition keeps its own restart point; a partition this consumer just lost refuses the
        seek, which is fine: its new owner starts from the committed offset."""
        if self.schedule.is_paused(tp) or tp in self._awaiting:
            return
        queue = self._queues.get(tp)
        if queue is not None:  # what waits in memory comes before `offset`: read it again, too
            if queue:
                offset = min(offset, queue[0][0].offset)
            self._forget_queue(tp)
        try:
            self._consumer.seek(tp, offset)
        except KafkaClientError as exc:
            log.debug("%s: no seek back on %s[%d]: %s", self._name, tp[0], tp[1], exc)
            return
        self._awaiting[tp] = offset
        if tp in self._client_paused:  # a queue had stopped its fetching
            self._resume_client([tp])

    def release(self, tp: TopicPartition) -> None:
        """Lift a hold; resumes `tp` unless a due time (or a full queue) still keeps it paused."""
        if self.schedule.release(tp):
            self._resume([tp])

    def resume_due(self, now_ms: int) -> None:
        """Resume every partition whose head record is due by `now_ms`."""
        ready = self.schedule.pop_due(now_ms)
        if ready:
            self._resume(ready)

    def _resume(self, tps: list[TopicPartition]) -> None:
        tps = [tp for tp in tps if tp not in self._stopped]  # a stopped queue decides when it fetches again
        for tp in tps:
            target = self._awaiting.get(tp)
            if target is not None:
                # Seek again: cheap, and it makes the restart point independent of what the client
                # remembers about a partition that was paused for a long time.
                self._consumer.seek(tp, target)
        self._resume_client(tps)
        for tp in tps:
            log.debug("%s: resumed %s[%d]", self._name, tp[0], tp[1])
            self._emitter.emit(Event.PARTITION_RESUMED, consumer=self._name, topic=tp[0], partition=tp[1])

    # -- waiting in memory -------------------------------------------------------------------------------

    def queued(self, tp: TopicPartition) -> bool:
        """Whether earlier records of `tp` wait in memory (so a later one must queue behind them)."""
        return tp in self._queues

    def holds_key(self, key: AuditKey) -> bool:
        """Whether a record with this audit key waits in memory to be handled."""
        return key in self._queued_keys

    def enqueue(self, msg: Message, due_ms: int | None, item: Queued, now_ms: int) -> None:
        """Queue `msg` behind the other records of its partition (`due_ms` None: due already, e.g. a record
        with unreadable headers that only waits for its turn)."""
        tp = msg.tp
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        if item.key is not None and item.duplicate is None:
            self._queued_keys[item.key] += 1
        if queue and msg.offset < queue[0][0].offset:
            # taken from the head and waiting again (a follower awaiting an acknowledgement): back to the head
            queue.appendleft((msg, due_ms, item))
            return
        queue.append((msg, due_ms, item))
        self._next[tp] = max(self._next.get(tp, 0), msg.offset + 1)
        far = due_ms is not None and due_ms - now_ms > self.ahead_ms
        if (far or len(queue) >= self.max_records) and tp not in self._stopped:
            # Stop fetching; no seek, so the records of this batch still arriving are the queue's continuation.
            self._stopped.add(tp)
            self._pause_client(tp)
            log.debug(
                "%s: %s[%d] stops fetching with %d records waiting in memory", self._name, tp[0], tp[1], len(queue)
            )

    def take_due(self, now_ms: int, *, refill: bool = True) -> Iterator[tuple[Message, Queued]]:
        """Pop queued records that are due, in offset order per partition (a held partition waits). A queue
        head due beyond the horizon goes back to waiting in Kafka (seek back to it, pause until due).

        `refill=False` while the loop is still going through a fetched batch: more of a queued partition's
        records may follow in that batch, so its queue stays (even empty) and it is not sought or resumed.
        """
        for tp in list(self._queues):
            queue = self._queues.get(tp)
            while queue and not self.schedule.is_held(tp):
                msg, due_ms, item = queue[0]
                if due_ms is not None and due_ms > now_ms:
                    if due_ms - now_ms > self.ahead_ms:
                        self._forget_queue(tp)
                        self.pause_until(tp, msg.offset, due_ms)
                    break
                queue.popleft()
                self._unkey(item)
                yield msg, item
                queue = self._queues.get(tp)  # the loop may have dropped it (revoked) while acting
            if refill and queue is not None and tp in self._queues:
                self._refill(tp, queue, now_ms)

    def _refill(self, tp: TopicPartition, queue: deque[_Entry], now_ms: int) -> None:
        # Fetch again once the queue is half empty (empty: the partition is an ordinary one again).
        if not queue:
            next_offset = self._next[tp]
            self._forget_queue(tp)
            if tp in self._client_paused and not self.schedule.is_paused(tp):
                self._consumer.seek(tp, next_offset)
                self._resume_client([tp])
            return
        tail_due = queue[-1][1]
        far_tail = tail_due is not None and tail_due - now_ms > self.ahead_ms  # what follows it is no sooner
        if tp in self._stopped and len(queue) <= self.max_records // 2 and not far_tail:
            self._stopped.discard(tp)
            if not self.schedule.is_paused(tp):
                self._consumer.seek(tp, self._next[tp])
                self._resume_client([tp])

    def _unkey(self, item: Queued) -> None:
        if item.key is not None and item.duplicate is None:
            self._queued_keys[item.key] -= 1
            if self._queued_keys[item.key] <= 0:
                del self._queued_keys[item.key]

    def _forget_queue(self, tp: TopicPartition) -> None:
        for _, _, item in self._queues.pop(tp, ()):
            self._unkey(item)
        self._next.pop(tp, None)
        self._stopped.discard(tp)

    def queue_starts(self) -> dict[TopicPartition, int]:
        """Where each partition with a queue would be read again from: its head, or after its tail when empty."""
        return {tp: queue[0][0].offset if queue else self._next[tp] for tp, queue in self._queues.items()}

    def next_queued_due_ms(self) -> int | None:
        """The earliest due time among queue heads that can run (None: no queued work)."""
        heads = [q[0][1] or 0 for tp, q in self._queues.items() if q and not self.schedule.is_held(tp)]
        return min(heads) if heads else None

    def any_queued_due(self, now_ms: int) -> bool:
        due = self.next_queued_due_ms()
        return due is not None and due <= now_ms

    # -- both --------------------------------------------------------------------------------------------

    def unhandled_from(self, tp: TopicPartition) -> int | None:
        """Where a waiting `tp` is read again from (its queue's head, else the offset it was sought back to);
        None when it does not wait."""
        queue = self._queues.get(tp)
        if queue is not None:
            return queue[0][0].offset if queue else self._next[tp]
        return self._awaiting.get(tp)

    def head_due_ms(self, tp: TopicPartition) -> int | None:
        """The due time of the record `tp` waits on, in memory or in Kafka (None: it waits on none)."""
        queue = self._queues.get(tp)
        if queue:
            return queue[0][1]
        head = self._heads.get(tp)
        return head[1] if head is not None and self._awaiting.get(tp) == head[0] else None

    def drop(self, tps: list[TopicPartition]) -> None:
        """Forget revoked partitions: their timers never fire, their queues are dropped (not committed, so
        the next owner reads them again), and a new assignment starts unpaused."""
        for tp in tps:
            self.schedule.drop(tp)
            self._awaiting.pop(tp, None)
            self._forget_queue(tp)
            self._client_paused.discard(tp)
            self._first_seen.pop(tp, None)
            self._heads.pop(tp, None)

    def wait_ms(self, now_ms: int, cap_ms: int) -> int:
        wait = self.schedule.wait_ms(now_ms, cap_ms)
        queued = self.next_queued_due_ms()
        return wait if queued is None else max(0, min(wait, queued - now_ms))

    def _pause_client(self, tp: TopicPartition) -> None:
        if tp not in self._client_paused:
            self._consumer.pause([tp])
            self._client_paused.add(tp)

    def _resume_client(self, tps: list[TopicPartition]) -> None:
        if tps:
            self._consumer.resume(tps)
            self._client_paused.difference_update(tps)
