"""Records of batch handlers waiting for their call (`RetryApp.batch_handler`).

The loop decides about each record as for a single-record handler (suppress a duplicate, wait for its due
time, decode it), but a record to handle is *deferred*: the records of one partition gathered from one poll
are passed to one handler call, in offset order, and each outcome is then settled exactly as a single call's
would be (success: finished; failure: routed and handed off). A record that failed before any call (poison,
invalid retry headers) waits with them, so that every partition's records are settled in offset order: the
offset tracker needs that, and so does the guarantee that nothing is committed past an unsettled record.

Whatever else the loop does to a partition (pause it, suppress a duplicate, track an offset) first settles
what is deferred for it (`BatchCaller.before_acting`, runtime/batch_calls.py). A main consumer whose
handlers all take batches skips this for plain source records (`BatchCaller.call_run`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from retrytopics.core.dedupe import AuditKey
from retrytopics.core.headers import RetryHeaders
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.runtime.dispatch import Binding

__all__ = ["Deferred", "DeferredCalls"]


class Deferred(NamedTuple):
    binding: Binding
    msg: Message
    key: AuditKey | None
    record: Record[Any]
    state: RetryHeaders | None
    #: known before any call (poison, invalid headers): settled in its place, never passed to the handler
    failure: BaseException | None


class DeferredCalls:
    """Deferred records per partition, in offset order, and the audit keys among them."""

    def __init__(self) -> None:
        self._groups: dict[TopicPartition, list[Deferred]] = {}
        self.keys: set[AuditKey] = set()

    def __bool__(self) -> bool:
        return bool(self._groups)

    def holds(self, tp: TopicPartition) -> bool:
        return tp in self._groups

    def add(self, item: Deferred) -> None:
        self._groups.setdefault(item.msg.tp, []).append(item)
        if item.key is not None:
            self.keys.add(item.key)

    def take(self, tp: TopicPartition | None = None) -> list[list[Deferred]]:
        """The groups of `tp` (default: every partition), removed from here."""
        if tp is None:
            groups, self._groups = list(self._groups.values()), {}
        else:
            group = self._groups.pop(tp, None)
            groups = [] if group is None else [group]
        for group in groups:
            self.keys.difference_update(item.key for item in group if item.key is not None)
        return groups
