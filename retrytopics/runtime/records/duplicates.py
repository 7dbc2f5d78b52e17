"""Records that repeat a hand-off already made: decided once, when the record is read, and finished without
a handler call (a `Duplicate` outcome, runtime/records/outcome.py):

- a hop handled here already (its audit key is in the duplicate audit, dedupe.py): a republish that a crash
  duplicated;
- a record whose hand-off was found downstream when its partition was assigned: a previous owner handled it
  and handed it off, then died before committing it.

**Seeding at assignment.** A consumer killed after a hand-off (to a tier or the DLQ) was acknowledged, but
before the commit covering it, leaves the record to the partition's next owner, which would handle it again
and write a second copy downstream (a second DLQ record at the last hop). The hop the dead owner wrote is in
the destination topic, carrying the record's audit key (`dedupe.hand_off_key`) and its key and value. So when
partitions are assigned, the loop reads the last `seed_last` records of every partition of their destinations
(every tier of their handler and its DLQ: a retry-after hint may pick any tier), for at most `seed_timeout_s`,
assign()-only and read_committed, and remembers their keys with a digest of their key and value
(`dedupe.HandOffs`); a record whose hand-off is among them, carrying its own key and value (or the
`too_large` reference it would make), is suppressed, neither handled nor handed off.

**An operator's reset.** Seeding must not suppress records an operator sent the group back to on purpose
(`kafka-consumer-groups --reset-offsets`): their earlier hops are downstream, and would make every one of them
look handed off. Every offset this library commits carries its mark (core/commit_marks.py); at assignment the
loop reads the metadata of each partition's committed offset, and where someone else committed it, hops
written before that moment are not recognised for that partition's records (its seed floor), now or by any
later owner (the floor rides on every later commit of the partition).

Cost per assignment: at most `seed_last` x (tiers + 1) x partitions-per-destination records read, inside the
rebalance callback (so before any record of the assigned partitions), and never longer than `seed_timeout_s`.
A hand-off older than that tail is not recognised: the record is handled again (at-least-once, never lost).
With header keys (`verified_tails`), a tail record whose signature does not verify seeds nothing: otherwise a
principal with WRITE on a tier could forge a hop and make its source record be skipped as handed off already,
a silent loss. A keyed record of a key-ordered handler is never suppressed this way: the seed says that its hop
exists, not where it went (which tier, or the DLQ), and key order must know that before the records of its key
behind it are decided (a tier's passage, a main consumer's chain: docs/key-ordering.md, section 9); it is handled
again instead (at-least-once). Not used in exactly-once mode: the transaction covers the hand-off there, and a broker that
shows aborted records (tansu) would make an aborted hand-off look done and lose the record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from retrytopics.core.commit_marks import MARK_PREFIX, commit_mark, seed_floor
from retrytopics.core.dedupe import HandOffs, audit_key, hand_off_key, record_digest
from retrytopics.core.errors import HeaderDecodeError, KafkaClientError
from retrytopics.core.headers import RetryHeaders, decode, decode_lineage
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.router import origin_message_id, too_large_reference_record
from retrytopics.core.signing import HeaderKeys, verify
from retrytopics.runtime.clock import SYSTEM_CLOCK, Clock
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.outcome import Duplicate

__all__ = ["CommitMarks", "DuplicateCheck", "TailReader", "destinations", "seed", "seed_floors", "verified_tails"]

log = logging.getLogger("retrytopics.runtime")

#: `read(topics, last, timeout_s)`: the last `last` records of every partition of `topics`, read within
#: `timeout_s` (`connectors.clients.read_tails`)
TailReader = Callable[[Sequence[str], int, float], Iterable[Message]]


def verified_tails(read: TailReader, keys: HeaderKeys | None) -> TailReader:
    """`read`, keeping only tail records whose `retry.signature` verifies for their topic (`read` itself
    when there are no keys). The records dropped are counted in one warning, never shown."""
    if keys is None:
        return read

    def verified(topics: Sequence[str], last: int, timeout_s: float) -> list[Message]:
        tail = list(read(topics, last, timeout_s))
        kept = [m for m in tail if verify(keys, m.topic, m.key, m.value, m.headers) is None]
        if len(kept) < len(tail):
            log.warning(
                "hand-off audit: ignored %d tail records of %s whose signature does not verify (forged, "
                "or written before header_key was set)",
                len(tail) - len(kept),
                topics,
            )
        return kept

    return verified


def destinations(bindings: Mapping[str, Binding], tps: Iterable[TopicPartition]) -> list[str]:
    """Every topic a record of `tps` can be handed off to: its handler's tiers and DLQ."""
    topics: dict[str, None] = {}
    for topic, _ in tps:
        binding = bindings.get(topic)
        if binding is not None:
            topics.update(dict.fromkeys([*(t.topic for t in binding.ctx.topics.tiers), binding.ctx.topics.dlq]))
    return list(topics)


def seed(hand_offs: HandOffs, read: TailReader, topics: Sequence[str], *, last: int, timeout_s: float) -> int:
    """Remember the audit key of each record in the tails of `topics`, with the digest of its key and value;
    returns how many records were read.
    A failed read seeds nothing (logged): the records are then handled as before, at-least-once."""
    if not topics or last <= 0:
        return 0
    try:
        tail = list(read(topics, last, timeout_s))
    except KafkaClientError as exc:
        log.warning(
            "could not read the tails of %s to recognise earlier hand-offs (%s); a record a previous "
            "owner handed off without committing it is handled again",
            topics,
            exc,
        )
        return 0
    for msg in tail:
        try:
            hand_offs.remember(
                audit_key(decode(list(msg.headers))), record_digest(msg.key, msg.value), msg.timestamp_ms
            )
        except HeaderDecodeError:
            continue  # not a hop this library wrote
    log.debug("seeded the hand-off audit from %d records of %s", len(tail), topics)
    return len(tail)


class CommitMarks(Protocol):
    """The consumer's side of the commit marks (core/ports.py, `ConsumerPort`)."""

    def committed_metadata(self, tps: Sequence[TopicPartition], timeout_s: float) -> dict[TopicPartition, str]: ...

    def mark_commits(self, marks: Mapping[TopicPartition, str]) -> None: ...


def seed_floors(
    marks: CommitMarks, tps: Sequence[TopicPartition], *, now_ms: int, timeout_s: float
) -> dict[TopicPartition, int]:
    """Each partition's seed floor, read from the metadata of its committed offset, and marked on the
    consumer for its later commits. A failed read takes `now_ms` for every partition: hops found are not
    trusted, so their records are handled again (at-least-once) rather than maybe skipped after a reset."""
    try:
        committed: Mapping[TopicPartition, str | None] = marks.committed_metadata(tps, timeout_s)
    except KafkaClientError as exc:
        log.warning(
            "could not read the committed offsets of %s (%s): hand-offs found downstream are not trusted for "
            "their records, which are handled again",
            tps,
            exc,
        )
        committed = dict.fromkeys(tps, "")
    floors = {tp: seed_floor(committed.get(tp), now_ms) for tp in tps}
    marks.mark_commits({tp: commit_mark(floor) for tp, floor in floors.items()})
    for tp, floor in floors.items():
        if floor and not (committed.get(tp) or "").startswith(MARK_PREFIX):  # found now, not carried by a mark
            log.info(
                "%s[%d]: its committed offset was set outside this library (an offset reset?): hand-offs written "
                "before %d are not taken for those of its records",
                tp[0],
                tp[1],
                floor,
            )
    return floors


class DuplicateCheck:
    """The hand-offs found downstream of one loop's partitions at assignment, and the `Duplicate` outcomes."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        *,
        tail_reader: TailReader | None,
        seed_last: int,
        seed_timeout_s: float,
        marks: CommitMarks | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._bindings = bindings
        self._tail_reader = tail_reader  # None: no seeding (module docstring)
        self._seed_last = seed_last
        self._seed_timeout_s = seed_timeout_s
        self._marks = marks  # None: every hop found counts (no group offsets to read)
        self._clock = clock
        self._floors: dict[TopicPartition, int] = {}
        self._handed_off = HandOffs()

    def seed(self, tps: list[TopicPartition]) -> None:
        """Partitions were assigned: remember the hand-offs already downstream of them."""
        if self._tail_reader is None:
            return
        if self._marks is not None and tps:
            self._floors.update(
                seed_floors(self._marks, tps, now_ms=self._clock.now_ms(), timeout_s=self._seed_timeout_s)
            )
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

    def was_handed_off(self, msg: Message, state: RetryHeaders | None, bad: BaseException | None) -> bool:
        """Whether the record's hand-off is among the hops found downstream at assignment."""
        if not self._handed_off or bad is not None:
            return False
        lineage = state.lineage if state is not None else decode_lineage(list(msg.headers))
        key = hand_off_key(state, (msg.topic, msg.partition, msg.offset), msg.timestamp_ms, lineage.replay_count)
        # the digest only for a key found (rare): a hop of another record at these coordinates is not its hop
        if key not in self._handed_off:
            return False
        if msg.key is not None and self._bindings[msg.topic].ordering is not None:
            return False  # key order must see what became of it: handled again (see the module docstring)
        floor = self._floors.get(msg.tp, 0)
        if self._handed_off.carries(key, record_digest(msg.key, msg.value), floor):
            return True
        # a hop refused as too large even without exception details carries a reference instead of the record
        reference = too_large_reference_record(msg.topic, msg.partition, msg.offset, msg.key, msg.value)
        return self._handed_off.carries(key, record_digest(*reference), floor)

    def duplicate(self, msg: Message, state: RetryHeaders | None, *, downstream: bool) -> Duplicate:
        if state is None:
            return Duplicate(msg, origin_message_id(self._bindings[msg.topic].ctx, msg), 0, downstream)
        return Duplicate(msg, state.origin_message_id, state.reconsume_times, downstream)
