"""The source path of the records stage: a main consumer's or a share consumer's records. A record of a source
topic carries no retry state the router would read (incoming ``retry.*`` headers are ignored there), so nothing
is decided per record but whether it was handed off downstream already (a hop a previous owner wrote,
runtime/records/duplicates.py): never a duplicate hop, never waiting.

- `read(msg)`: one record: handled (`_handle`), or finished as a hand-off found downstream.
- `plain_runs(batch, accepting)` / `runs_of(polled, accepting)`: a poll as runs per partition, each to
  `call_run` (one `SucceededRun` for the calls that returned between two failures), when no record of it was
  handed off downstream; `runs_of` adds the runs the consumer built as the handlers' Records already
  (`run_topics`, `ports.consume_runs`).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator, Mapping

from retrytopics.connectors.serde import bytes_value
from retrytopics.core.dedupe import DuplicateAudit
from retrytopics.core.offsets import TopicPartition
from retrytopics.core.ports import Message, Polled, message_of
from retrytopics.runtime.clock import Clock
from retrytopics.runtime.records.calls import Binding, Invoker, Run
from retrytopics.runtime.records.duplicates import DuplicateCheck
from retrytopics.runtime.records.outcome import Outcome
from retrytopics.runtime.records.ownership import OwnershipGuard
from retrytopics.runtime.records.stage import Accepting, RecordStage

__all__ = ["SourceStage"]


class SourceStage(RecordStage):
    """The records stage of a main or share consumer (see the module docstring)."""

    def __init__(
        self,
        bindings: Mapping[str, Binding],
        audit: DuplicateAudit,
        invoker: Invoker,
        ownership: OwnershipGuard,
        duplicates: DuplicateCheck,
        *,
        clock: Clock,
        rng: random.Random,
        stop: threading.Event,
    ) -> None:
        super().__init__(bindings, audit, invoker, ownership, duplicates, clock=clock, rng=rng, stop=stop)
        #: what `build_record` would make of these topics' records needs nothing of the binding
        self.run_topics = frozenset(
            topic
            for topic, b in bindings.items()
            if b.ordering is None and b.value_deserializer is bytes_value and b.ctx.id_header is None
        )

    def read(self, msg: Message) -> Iterator[Outcome]:
        """A record just consumed and accepted: handled, unless a previous owner handed it off already."""
        duplicates = self._duplicates
        if duplicates.seeded and duplicates.was_handed_off(msg, None, None):
            # what is deferred for the partition's batch handler is called first (offset order)
            if self.batches.holds(msg.tp) and not (yield from self.batches.settle(msg.tp)):
                return
            yield duplicates.duplicate(msg, None, downstream=True)
            return
        yield from self._handle(self._bindings[msg.topic], msg, None, None, None)

    def plain_runs(self, batch: list[Message], accepting: Accepting) -> list[tuple[Binding, Run]] | None:
        """`batch` as runs per partition, when each record would be handed to its handler as it is (none was
        handed off downstream already). None: read the records one by one."""
        # rare: only after a previous owner died between hand-off and commit. Asked before any `accept`,
        # which the records' ordinary path then asks again (accepting a sought-back record forgets the seek)
        duplicates = self._duplicates
        if duplicates.seeded and any(duplicates.was_handed_off(m, None, None) for m in batch):
            return None
        accept = accepting.accept
        runs: dict[TopicPartition, list[Message]] = {}
        run: list[Message] = []
        tp: TopicPartition = ("", -1)
        open_ = False  # every record of `tp` is accepted without asking (a poll comes in runs per partition)
        for msg in batch:
            if msg.partition != tp[1] or msg.topic != tp[0]:
                tp = (msg.topic, msg.partition)
                run = runs.setdefault(tp, [])
                open_ = accepting.accepts_all(tp)
            if open_ or accept(msg):
                run.append(msg)
        return [(self._bindings[tp[0]], run) for tp, run in runs.items() if run]

    def runs_of(self, polled: Polled, accepting: Accepting) -> tuple[list[Message], list[tuple[Binding, Run]] | None]:
        """`polled` as `plain_runs` makes it, its runs of Records built by the consumer included, each as
        it is; when those runs cannot be taken as they are (a partition sought back, records handed off
        downstream already), every record as a Message again. With None: read `batch` record by record."""
        batch, built = polled
        if built:
            duplicates = self._duplicates
            if not (
                duplicates.seeded
                and any(duplicates.was_handed_off(message_of(r), None, None) for run in built for r in run)
            ) and all(accepting.accepts_all((run[0].topic, run[0].partition)) for run in built):
                runs = self.plain_runs(batch, accepting)
                if runs is not None:
                    taken: list[tuple[Binding, Run]] = [(self._bindings[run[0].topic], run) for run in built]
                    return batch, taken + runs
            batch = batch + [message_of(r) for run in built for r in run]
        return batch, self.plain_runs(batch, accepting)
