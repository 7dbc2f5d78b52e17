"""Head-of-line pausing for tier consumers: pause a partition whose head record is not due, seek back to
it, resume it when due.

Every record in a tier topic waits the same delay, so due times are ordered within a partition (up to jitter,
see docs/architecture.md): when the head record is not due, nothing behind it is, and pausing the partition
costs nothing. The consumer keeps polling other partitions (and heartbeating), sleeping in `consume()` no
longer than the next due time: CPU stays near zero while every partition waits.

The same mechanism *holds* a source partition while a publish for it is failing, so that a broker outage
does not pile up records in memory. Pausing is normal operation: it is logged at DEBUG only.
"""

from __future__ import annotations

import logging

from retrytopics.errors import KafkaClientError
from retrytopics.events import Emitter, Event
from retrytopics.offsets import TopicPartition
from retrytopics.ports import ConsumerPort, Message
from retrytopics.schedule import PauseSchedule

__all__ = ["PauseController"]

log = logging.getLogger("retrytopics.tiers")


class PauseController:
    """Pauses, seeks and resumes partitions of one consumer; decides which fetched messages to act on.

    After a seek back to offset X, messages of that partition still in flight from before the seek are
    stale: until X itself arrives, every message of the partition other than X is ignored.
    """

    def __init__(self, consumer: ConsumerPort, emitter: Emitter, *, consumer_name: str) -> None:
        self._consumer = consumer
        self._emitter = emitter
        self._name = consumer_name
        self.schedule: PauseSchedule[TopicPartition] = PauseSchedule()
        self._awaiting: dict[TopicPartition, int] = {}  # partition -> the offset it was sought back to

    @property
    def paused(self) -> frozenset[TopicPartition]:
        return self.schedule.paused

    def accept(self, msg: Message) -> bool:
        """Whether the loop should act on `msg` (its partition is not paused and it is not stale)."""
        tp = msg.tp
        if self.schedule.is_paused(tp):
            return False
        target = self._awaiting.get(tp)
        if target is None:
            return True
        if msg.offset != target:
            return False
        del self._awaiting[tp]
        return True

    def pause_until(self, tp: TopicPartition, offset: int, due_ms: int) -> None:
        """Pause `tp` until `due_ms`, to restart at `offset` (the head record, not due yet)."""
        was_paused = self.schedule.is_paused(tp)
        self.schedule.pause_until(tp, due_ms=due_ms)
        self._park(tp, offset, was_paused)
        log.debug("%s: paused %s[%d] at offset %d until %d", self._name, tp[0], tp[1], offset, due_ms)
        self._emitter.emit(Event.PARTITION_PAUSED, consumer=self._name, topic=tp[0], partition=tp[1], until=due_ms)

    def hold(self, tp: TopicPartition, offset: int | None) -> None:
        """Pause `tp` until `release(tp)`; restart at `offset` (None: where the consumer stands)."""
        was_paused = self.schedule.is_paused(tp)
        self.schedule.hold(tp)
        if offset is not None:
            self._park(tp, offset, was_paused)
        elif not was_paused:
            self._consumer.pause([tp])
        self._emitter.emit(Event.PARTITION_PAUSED, consumer=self._name, topic=tp[0], partition=tp[1], until=None)

    def _park(self, tp: TopicPartition, offset: int, was_paused: bool) -> None:
        if not was_paused:
            self._consumer.pause([tp])
        self._awaiting[tp] = offset
        self._consumer.seek(tp, offset)

    def restart_at(self, tp: TopicPartition, offset: int) -> None:
        """Read `tp` again from `offset` (records the loop fetched but did not act on). A paused or already
        sought-back partition keeps its own restart point; a partition this consumer just lost refuses the
        seek, which is fine: its new owner starts from the committed offset."""
        if self.schedule.is_paused(tp) or tp in self._awaiting:
            return
        try:
            self._consumer.seek(tp, offset)
        except KafkaClientError as exc:
            log.debug("%s: no seek back on %s[%d]: %s", self._name, tp[0], tp[1], exc)
            return
        self._awaiting[tp] = offset

    def release(self, tp: TopicPartition) -> None:
        """Lift a hold; resumes `tp` unless a due time still keeps it paused."""
        if self.schedule.release(tp):
            self._resume([tp])

    def resume_due(self, now_ms: int) -> None:
        """Resume every partition whose head record is due by `now_ms`."""
        ready = self.schedule.pop_due(now_ms)
        if ready:
            self._resume(ready)

    def _resume(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            target = self._awaiting.get(tp)
            if target is not None:
                # Seek again: cheap, and it makes the restart point independent of what the client
                # remembers about a partition that was paused for a long time.
                self._consumer.seek(tp, target)
        self._consumer.resume(tps)
        for tp in tps:
            log.debug("%s: resumed %s[%d]", self._name, tp[0], tp[1])
            self._emitter.emit(Event.PARTITION_RESUMED, consumer=self._name, topic=tp[0], partition=tp[1])

    def drop(self, tps: list[TopicPartition]) -> None:
        """Forget revoked partitions: their timers never fire, and a new assignment starts unpaused."""
        for tp in tps:
            self.schedule.drop(tp)
            self._awaiting.pop(tp, None)

    def wait_ms(self, now_ms: int, cap_ms: int) -> int:
        return self.schedule.wait_ms(now_ms, cap_ms)
