"""What finishes a record, the seam of the hand-off (runtime/handoff/handoff.py): a `Finisher` is given to the
one `HandOff`, which calls it and never the reverse. Three implementations: offsets committed
(`OffsetsCommitted`, runtime/handoff/at_least_once.py), a transaction per batch (`TransactionPerBatch`,
runtime/handoff/exactly_once.py), an acknowledgement (`Acknowledgements`, runtime/handoff/acknowledge.py).
A finisher that commits says what it committed as a value (`Commit`), which the hand-off announces.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from retrytopics.core.dedupe import AuditKey
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.runtime.handoff.publish import PublishJob

__all__ = ["Commit", "CommitSettings", "Finisher"]


class CommitSettings(Protocol):
    """The part of `LoopSettings` a hand-off and its finisher read."""

    @property
    def name(self) -> str: ...
    @property
    def commit_every(self) -> int: ...
    @property
    def commit_interval_ms(self) -> int: ...
    @property
    def commit_on_ack(self) -> bool: ...
    @property
    def drain_timeout_s(self) -> float: ...
    @property
    def revoke_drain_timeout_s(self) -> float: ...


class Commit(NamedTuple):
    """What a finisher committed: the consumed offsets, and the hand-offs the commit made durable (a
    transaction's), for the hand-off to announce (`offsets.committed` follows their announcements)."""

    offsets: Mapping[TopicPartition, int]
    synchronous: bool
    jobs: list[PublishJob]


class Finisher(Protocol):
    """What finishes a record, for the hand-off (see the module docstring): offsets committed, a transaction
    per batch, or an acknowledgement. A method that commits offsets returns what it committed (`Commit`),
    None when it committed none."""

    @property
    def commits_in_transactions(self) -> bool:
        """Offsets finished in an open transaction must not be committed outside it (ownership.py)."""

    @property
    def finishes_when_sent(self) -> bool:
        """Whether a hand-off is durable with what finishes it as soon as it is sent (a transaction's): the
        hand-off then calls `sent`, else `acked` once the publisher acknowledged it."""

    @property
    def settle_wait_s(self) -> float | None:
        """How long a batch's end waits for its publishes to be acknowledged, after which the rest is given
        back (`unacknowledged`); None: a batch's end does not wait for them."""

    def remember(self, key: AuditKey) -> None:
        """A record about to be finished was handled (or handed off): its key goes to the duplicate audit."""

    def track(self, tp: TopicPartition, offset: int) -> int:
        """Start tracking a record about to be handed off; returns the epoch its hand-off carries."""

    def finish(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """Finish a tracked record (a duplicate, or a record tracked while key order parked it)."""

    def finish_at_once(self, tp: TopicPartition, offset: int) -> None:
        """Finish a record as soon as it is read: its handler succeeded."""

    def finish_run(self, tp: TopicPartition, msgs: list[Message] | list[Record[Any]]) -> None:
        """Finish a run of successes (consecutive records of `tp`, increasing offsets)."""

    def sent(self, job: PublishJob) -> None:
        """`job` was handed to the publisher: with `finishes_when_sent`, it is durable with what finishes it,
        which finishes it now (the hand-off calls this only then)."""

    def acked(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """Finish a hand-off whose acknowledgement (and key-state write) arrived."""

    def served(self, *, within_batch: bool) -> Commit | None:
        """Delivery reports were served: commit what they finished, if this finisher does so."""

    def polled(self, read_to: Mapping[TopicPartition, int]) -> Commit | None:
        """A poll delivered records up to `read_to` (one past the last offset, per partition); empty: the poll
        was idle, when a partition whose every delivered record is finished may commit the consumer's position
        (runtime/handoff/tails.py)."""

    def wait_ms(self, wait_ms: int, *, in_flight: bool) -> int:
        """The longest `consume()` wait, given the one asked for and whether hand-offs are unacknowledged."""

    def unacknowledged(self, jobs: list[PublishJob]) -> None:
        """`settle_wait_s` passed at a batch's end: `jobs` were dropped unacknowledged; give their records
        back, and whatever else of the batch is not finished."""

    def end_batch(self) -> Commit | None: ...
    def revoked(self, tps: list[TopicPartition]) -> Commit | None: ...
    def reading_key_state(self) -> Commit | None:
        """Key state is about to be read at an assignment (read_committed, up to every transaction open in it
        when the read begins): a transaction commits its own open one first."""

    def lost(self, tps: list[TopicPartition]) -> None: ...
    def crashed(self, cause: BaseException) -> None: ...
    def shutdown(self) -> Commit | None: ...
