"""What the records stage says about each record it reads: one outcome value, never an action.

The records stage (runtime/records/stage.py) reads, decides and calls handlers; it does not pause, publish or
commit. Each step yields outcomes, in the order of the records they describe per partition, and the poll
cycle (runtime/consumer/cycle.py) hands each to the one part that acts on it:

- `Succeeded`, `SucceededRun`, `Failed`, `Duplicate` -> the hand-off (runtime/handoff/), the only code that
  finishes offsets, publishes and commits;
- `Waiting` -> waiting (runtime/waiting.py): pause the partition in Kafka, or queue the record in memory;
- `Abandoned` -> the cycle: the record and the rest of the poll's records of every partition not yet acted
  on are read again (here, or by whoever owns the partition now).
- `Follow` (a key-ordered handler's record of a blocked key) -> the hand-off, which publishes it unhandled
  behind its key's predecessor; `Parked` (its key's last hop is not acknowledged) -> the hand-off, which keeps
  its offset unfinished while key order keeps the record in memory and the partition goes on; `Held` (the
  partition is at its bound of blocked keys or of parked records) -> waiting: the partition stops at that
  record until key order lets it through (runtime/keyorder/ordering.py).

A consumer model without partitions (a share group: per-record acknowledgement, nothing to pause or commit)
consumes the same values with its own hand-off: `Succeeded` is an ACCEPT, `Failed` an ACCEPT once its route
is acknowledged, `Abandoned` a RELEASE (docs/architecture.md, "A second consumer model").
"""

from __future__ import annotations

from typing import Any, NamedTuple

from retrytopics.core.dedupe import AuditKey
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.keyorder.follower import Follower
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.core.router import Route, RouteContext

__all__ = [
    "Abandoned",
    "Duplicate",
    "Failed",
    "Follow",
    "Held",
    "Outcome",
    "Parked",
    "Queued",
    "Succeeded",
    "SucceededRun",
    "Waiting",
]


class Succeeded(NamedTuple):
    """The handler call on `msg` returned."""

    msg: Message
    key: AuditKey | None
    record: Record[Any]


class SucceededRun(NamedTuple):
    """The handler calls on consecutive records of one partition all returned (a batch handler's call, or a
    plain run of source records): finished in one step. `records` is None for source records (attempt 1, no
    due time, no audit key); `msgs` are then the Records themselves where the consumer built them
    (`ports.consume_runs`): only their coordinates are read."""

    tp: TopicPartition
    msgs: list[Message] | list[Record[Any]]
    records: list[Record[Any]] | None
    keys: list[AuditKey]


class Failed(NamedTuple):
    """The handler failed on `msg` (or it failed before any call: poison, invalid retry headers): `route` is
    where it goes, decided once."""

    msg: Message
    key: AuditKey | None
    record: Record[Any]
    failure: BaseException
    route: Route
    #: the handler's routing context (a too-large refusal re-routes with it)
    ctx: RouteContext


class Duplicate(NamedTuple):
    """`msg` repeats a hand-off already made: finished without a call. `downstream`: found in a destination
    when the partition was assigned (else handled here already)."""

    msg: Message
    origin_message_id: str
    attempt: int
    downstream: bool


class Queued(NamedTuple):
    """What a record waiting in memory was decided to be, kept with it: handled when due, or finished as a
    duplicate when its turn comes (it is never decided again)."""

    state: RetryHeaders | None
    key: AuditKey | None
    #: the retry headers could not be read: handled as a failure in its turn
    bad: BaseException | None
    duplicate: Duplicate | None


class Waiting(NamedTuple):
    """`msg` is not due before `due_ms` (None: due, it only waits for the records before it), in memory
    with what was decided about it, or in Kafka (`queued` None: pause the partition, seek back to `msg`)."""

    msg: Message
    due_ms: int | None
    queued: Queued | None


class Abandoned(NamedTuple):
    """This consumer must leave `msg` alone (it may no longer own the partition, or the app is stopping): it
    and what follows it in the poll are read again, never handed off or committed here."""

    msg: Message


class Follow(NamedTuple):
    """`msg`'s key is blocked (docs/key-ordering.md): it is handed off unhandled to tier `tier` as `follower`
    (behind the record of its key at source offset `follower.after`), and finished once that hop and its
    key-state record are durable. `msg` is a source record, or a follower read in a tier and forwarded: it
    waited there behind `behind`."""

    msg: Message
    tier: int
    follower: Follower
    #: the handler's routing context (its tiers, group, id header and header keys)
    ctx: RouteContext
    behind: int


class Held(NamedTuple):
    """Key order stops `msg`'s partition at `msg` (its key's last hop is not acknowledged yet, the partition is
    at its bound of blocked keys, or its key state is not read yet): read again from `msg` once released."""

    msg: Message


class Parked(NamedTuple):
    """Key order keeps `msg` in memory until its key's last hop is acknowledged (runtime/keyorder/ordering.py):
    its offset is tracked now, unfinished, so no commit passes it while later records of other keys go on."""

    msg: Message


Outcome = Succeeded | SucceededRun | Failed | Duplicate | Waiting | Abandoned | Follow | Held | Parked
