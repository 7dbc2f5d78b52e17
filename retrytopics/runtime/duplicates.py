"""Records that repeat a hand-off already made are finished without a handler call (`duplicate.suppressed`):

- a hop handled here already (its audit key is in the duplicate audit, dedupe.py): a republish that a crash
  duplicated;
- a record whose hand-off was found downstream when its partition was assigned (runtime/seeding.py): a
  previous owner handled it and handed it off, then died before committing it.

Either is finished after what is deferred for its partition (runtime/batch_calls.py), so in offset order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from retrytopics.core.dedupe import HandOffs, hand_off_key, record_digest
from retrytopics.core.errors import HeaderDecodeError
from retrytopics.core.headers import RetryHeaders, decode_lineage
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.router import origin_message_id, too_large_reference_record
from retrytopics.observe.events import Event
from retrytopics.runtime.batch_calls import BatchCaller
from retrytopics.runtime.dispatch import Binding
from retrytopics.runtime.handoff import HandOff
from retrytopics.runtime.seeding import TailReader, destinations, seed

__all__ = ["DuplicateSuppressor"]

log = logging.getLogger("retrytopics.runtime")


class DuplicateSuppressor:
    """Finishes the duplicates of one loop; reads the hand-offs found downstream of its new partitions."""

    def __init__(
        self,
        handoff: HandOff,
        batches: BatchCaller,
        bindings: Mapping[str, Binding],
        emit: Callable[..., None],
        *,
        name: str,
        tail_reader: TailReader | None,
        seed_last: int,
        seed_timeout_s: float,
    ) -> None:
        self._handoff = handoff
        self._batches = batches
        self._bindings = bindings
        self._emit = emit
        self._name = name
        self._tail_reader = tail_reader  # None: no seeding (see runtime/seeding.py)
        self._seed_last = seed_last
        self._seed_timeout_s = seed_timeout_s
        self._handed_off = HandOffs()  # hops found downstream when partitions were assigned

    def seed(self, tps: list[TopicPartition]) -> None:
        """Partitions were assigned: remember the hand-offs already downstream of them."""
        if self._tail_reader is not None:
            seed(
                self._handed_off,
                self._tail_reader,
                destinations(self._bindings, tps),
                last=self._seed_last,
                timeout_s=self._seed_timeout_s,
            )

    @property
    def seeded(self) -> bool:
        """Whether any hand-off was found downstream at assignment (else no record needs the check)."""
        return bool(self._handed_off)

    def was_handed_off(self, msg: Message, state: RetryHeaders | None, bad: HeaderDecodeError | None) -> bool:
        """Whether the record's hand-off is among the hops found downstream at assignment."""
        if not self._handed_off or bad is not None:
            return False
        lineage = state.lineage if state is not None else decode_lineage(list(msg.headers))
        key = hand_off_key(state, (msg.topic, msg.partition, msg.offset), msg.timestamp_ms, lineage.replay_count)
        # the digest only for a key found (rare): a hop of another record at these coordinates is not its hop
        if key not in self._handed_off:
            return False
        if self._handed_off.carries(key, record_digest(msg.key, msg.value)):
            return True
        # a hop refused as too large even without exception details carries a reference instead of the record
        reference = too_large_reference_record(msg.topic, msg.partition, msg.offset, msg.key, msg.value)
        return self._handed_off.carries(key, record_digest(*reference))

    def suppress(self, msg: Message, state: RetryHeaders) -> None:
        """Finish a hop handled here already."""
        if not self._finish(msg):
            return
        log.info(
            "%s: duplicate suppressed: %s[%d]@%d repeats %s[%d]@%d attempt %d (a republish was duplicated by a crash)",
            self._name,
            msg.topic,
            msg.partition,
            msg.offset,
            state.original_topic,
            state.original_partition,
            state.original_offset,
            state.reconsume_times,
        )
        self._emit(
            Event.DUPLICATE_SUPPRESSED,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            origin_message_id=state.origin_message_id,
            reconsume_times=state.reconsume_times,
        )

    def finish_handed_off(self, msg: Message, state: RetryHeaders | None) -> None:
        """Finish a record handed off already, counted as a suppressed duplicate."""
        if not self._finish(msg):
            return
        log.info(
            "%s: duplicate suppressed: %s[%d]@%d was handed off already (found downstream at assignment)",
            self._name,
            msg.topic,
            msg.partition,
            msg.offset,
        )
        if state is None:
            origin, attempt = origin_message_id(self._bindings[msg.topic].ctx, msg), 0
        else:
            origin, attempt = state.origin_message_id, state.reconsume_times
        self._emit(
            Event.DUPLICATE_SUPPRESSED,
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            origin_message_id=origin,
            reconsume_times=attempt,
        )

    def _finish(self, msg: Message) -> bool:
        """Finish `msg` without a call; False (nothing done: it is read again with the rest) when settling
        what was deferred for its partition lost this consumer the partition."""
        if not self._batches.before_acting(msg.tp):
            return False
        self._handoff.finish(msg.tp, msg.offset, self._handoff.track(msg.tp, msg.offset))
        return True
