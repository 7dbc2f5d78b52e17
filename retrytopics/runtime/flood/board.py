"""The flood guards of a process, seen and steered from outside (docs/flood-guard.md, "Seen and steered from
outside"): a thread that writes each guard's `GuardReport` to its handler's compacted flood-guard topic, on each
change of state and every `report_every_s`, and reads that topic for an operator's `GuardCommand`
(`retrytopics guard open|close`), which it applies to the guard by hand. A clean stop writes the reports'
tombstones (`ProcessLeft`).

At start the topic is read to its end (`start`, in the caller's thread: an unreadable topic fails the start,
since a command given to every process must reach this one): the latest command per handler is applied if it
opens the guard (a later process of an app whose guard was opened by hand starts open). Then the thread reads
on from there. A command is applied only if its `at_ms` is later than the last applied for its handler: a copy
of an old command written again changes nothing.

Every record read is untrusted: one that does not decode, or with header keys is unsigned or does not verify,
is skipped and counted, with one WARNING each naming the reason, never the bytes. What a command can do is
what the topic's writers may do anyway: open or close the guard of a handler of this app, with a reason of at
most 200 printable characters that is logged.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from retrytopics.core.errors import ConfigError, KafkaClientError, PublishError
from retrytopics.core.flood_records import (
    GuardAction,
    GuardCommand,
    GuardRecordError,
    GuardReport,
    ProcessLeft,
    board_view,
    decode_guard_record,
    encode_guard_record,
)
from retrytopics.core.ports import Message, ProducerPort
from retrytopics.core.signing import HeaderKeys, verify_guard
from retrytopics.runtime.flood.breaker import HandlerGuard

__all__ = ["GuardBoard", "GuardFeed", "process_name"]

log = logging.getLogger("retrytopics.runtime")

_RETRY_S = 0.2
#: what a partition just created answers for a moment (a missing topic is UNKNOWN_TOPIC_OR_PART: not asked again)
_LEADERSHIP_SETTLING = frozenset({"NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE"})


def process_name(instance_id: str) -> str:
    """This process in its guards' reports: the app's `instance_id` (the pod name, or random), cut to what a
    report's key allows; a restart with the same id overwrites the report of the process it replaces."""
    return re.sub(r"[^A-Za-z0-9._:@-]", "_", instance_id)[:100] or "process"


class GuardFeed(Protocol):
    """An assign()-only reader of partitions as they grow (`ClientFactory.key_state_feed`)."""

    def add(self, topic: str, starts: Mapping[int, int]) -> None: ...
    def poll(self) -> list[Message]: ...
    def close(self) -> None: ...


#: `read(topic, partitions, timeout_s)`: every record up to the end now, or a `KafkaClientError`
GuardReader = Callable[[str, Sequence[int] | None, float], Iterable[Message]]


class GuardBoard:
    """The reports and commands of this process's guards (see the module docstring)."""

    def __init__(
        self,
        guards: Mapping[str, HandlerGuard],
        topics: Mapping[str, str],
        *,
        process: str,
        producer: Callable[[], ProducerPort],
        feed: Callable[[], GuardFeed],
        read: GuardReader,
        keys: HeaderKeys | None,
        wall_ms: Callable[[], int],
        stop: threading.Event,
        report_every_s: float = 30.0,
    ) -> None:
        self._guards = dict(guards)  # handler (its source topic) -> its guard
        self._topics = dict(topics)  # handler -> its flood-guard topic
        self._process = process
        self._make_producer = producer
        self._make_feed = feed
        self._read = read
        self._keys = keys
        self._wall_ms = wall_ms
        self._stop = stop
        self._report_every_s = report_every_s
        self._wake = threading.Event()
        self._applied_at: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._producer: ProducerPort | None = None
        #: records read and not trusted (malformed, or unsigned/forged with header keys)
        self.skipped = 0
        for guard in self._guards.values():
            guard.on_change = self._wake.set

    def start(self, timeout_s: float) -> None:
        """Read every flood-guard topic to its end and apply its latest opening commands, then go on in a thread."""
        starts: dict[str, int] = {}
        for topic in sorted(set(self._topics.values())):
            records = []
            next_offset = 0
            for msg in self._read_start(topic, timeout_s):
                next_offset = max(next_offset, msg.offset + 1)
                record = self._trusted(msg)
                if record is not None:
                    records.append(record)
            starts[topic] = next_offset
            for handler, command in board_view(records).commands.items():
                if handler in self._guards and self._topics[handler] == topic:
                    self._applied_at[handler] = command.at_ms
                    if command.action is GuardAction.OPEN:
                        self._apply(command)
        self._producer = self._make_producer()
        feed = self._make_feed()
        for topic, offset in starts.items():
            feed.add(topic, {0: offset})
        self._thread = threading.Thread(target=self._run, args=(feed,), name="retrytopics-flood-guard", daemon=True)
        self._thread.start()

    def _read_start(self, topic: str, timeout_s: float) -> list[Message]:
        # a topic just provisioned has no leader known everywhere for a moment: asked again, within timeout_s
        tries = max(1, int(timeout_s / _RETRY_S))
        for attempt in range(tries):
            try:
                return list(self._read(topic, None, timeout_s))
            except KafkaClientError as exc:
                if exc.code not in _LEADERSHIP_SETTLING or attempt == tries - 1 or self._stop.wait(_RETRY_S):
                    fix = "run app.provision() or `retrytopics topics create` with flood_guard = true"
                    raise ConfigError("flood_guard_topic", topic, f"cannot be read ({exc}); {fix}") from exc
        raise AssertionError("unreachable")

    def join(self, timeout_s: float | None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the thread ------------------------------------------------------------------------------------------

    def _run(self, feed: GuardFeed) -> None:
        last: dict[str, GuardReport] = {}
        reported_at: dict[str, float] = {}
        try:
            while not self._stop.is_set():
                try:
                    for msg in feed.poll():
                        record = self._trusted(msg)
                        if isinstance(record, GuardCommand):
                            self._command(msg.topic, record)
                    self._report_changed(last, reported_at)
                except KafkaClientError as exc:  # the guards work on: only their visibility waits
                    log.warning("flood guard reports and commands: %s; trying again", exc)
                self._wake.wait(0.2)
                self._wake.clear()
            self._leave()
        finally:
            feed.close()

    def _report_changed(self, last: dict[str, GuardReport], reported_at: dict[str, float]) -> None:
        now_s = self._wall_ms() / 1000
        for handler, guard in self._guards.items():
            report = guard.report(process=self._process, at_ms=self._wall_ms())
            # the counts that move while open (calls refused, time open) are written every report_every_s only
            shape = replace(report, at_ms=0, refused=0, open_ms=0)
            if last.get(handler) == shape and now_s - reported_at.get(handler, 0.0) < self._report_every_s:
                continue
            last[handler], reported_at[handler] = shape, now_s
            self._publish(handler, report)

    def _leave(self) -> None:
        if self._producer is None:
            return
        for handler in self._guards:
            self._publish(handler, ProcessLeft(handler=handler, process=self._process))
        if self._producer.flush(10.0):
            log.warning("flood guard reports: the last ones were not acknowledged within 10 s")

    def _publish(self, handler: str, record: GuardReport | ProcessLeft) -> None:
        assert self._producer is not None
        topic = self._topics[handler]
        key, value, headers = encode_guard_record(record, topic, self._keys)
        self._producer.produce(topic, key=key, value=value, headers=headers, partition=0, on_delivery=_delivered)
        self._producer.poll(0)

    # -- commands --------------------------------------------------------------------------------------------

    def _trusted(self, msg: Message) -> GuardCommand | GuardReport | ProcessLeft | None:
        if self._keys is not None:
            why = verify_guard(self._keys, msg.topic, msg.key, msg.value, msg.headers)
            if why is not None:
                self._skip(msg, f"signature {why}")
                return None
        try:
            return decode_guard_record(msg.key, msg.value)
        except GuardRecordError as exc:
            self._skip(msg, str(exc))
            return None

    def _skip(self, msg: Message, why: str) -> None:
        self.skipped += 1
        log.warning("flood guard topic %s[%d]@%d: record skipped: %s", msg.topic, msg.partition, msg.offset, why)

    def _command(self, topic: str, command: GuardCommand) -> None:
        handler = command.handler
        if handler not in self._guards or self._topics[handler] != topic:
            return  # another app's handler on a shared topic, or one this process does not run
        if command.at_ms <= self._applied_at.get(handler, -1):
            log.warning("flood guard of %s: a command no later than the last applied was ignored", handler)
            return
        self._applied_at[handler] = command.at_ms
        self._apply(command)

    def _apply(self, command: GuardCommand) -> None:
        self._guards[command.handler].force(command.action, f"by hand ({command.by}): {command.reason}")


def _delivered(error: PublishError | None) -> None:
    if error is not None:
        log.warning("flood guard report not written: %s", error)
