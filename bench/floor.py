"""The floors: the least any Python program must do per record to keep retrytopics' contract, written by hand
on confluent-kafka with nothing else (no validation, no events, no ownership checks, no redaction), run as
child roles. Set against the raw baselines of the same run (`bench.raw`), they say how close to a ratio
target Python can come at all on this machine: a target above its floor cannot be met by any runtime.

- `floor_batch`: a batch handler's contract: every record becomes an immutable record of its coordinates,
  key, value and headers, handed to one call per poll and partition; positions committed as `raw_consume`
  commits them.
- `floor_failure`: the failure path's contract: each record's handler raises; the exception is caught and
  described (type, message, a stack text formatted once per failure site); the record is republished with
  its value and the 16 retry headers a tier record carries; a position is committed only once every
  republish before it is acknowledged (at-least-once).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.measure import emit
from retrytopics.connectors.kafka import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS

__all__ = ["floor_batch", "floor_failure"]


class _Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


_new = tuple.__new__


def _record(msg: Message) -> _Record:
    headers = msg.headers()
    return _new(
        _Record,
        (
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.timestamp()[1],
            msg.key(),
            msg.value(),
            () if headers is None else tuple(headers),
        ),
    )


def _consumer(args: dict[str, Any]) -> Consumer:
    consumer = Consumer(
        {
            **CONSUMER_DEFAULTS,
            "bootstrap.servers": args["bootstrap"],
            "group.id": args["group"],
            **args.get("consumer_overrides", {}),
        }
    )
    consumer.subscribe([args["topic"]])
    return consumer


def floor_batch(args: dict[str, Any]) -> None:
    """Consume `n` records of `topic`; per poll and partition, one call of a no-op handler on the list of
    records. Args: bootstrap, topic, group, n, batch, commit_every, commit_interval_s, consumer_overrides."""
    consumer = _consumer(args)
    n, batch, every, interval = args["n"], args["batch"], args["commit_every"], args["commit_interval_s"]
    handler: Callable[[list[_Record]], None] = lambda records: None  # noqa: E731 - the user's no-op
    seen, first, since_commit, last_commit = 0, 0.0, 0, time.monotonic()
    positions: dict[tuple[str, int], int] = {}
    emit("ready")
    while seen < n:
        messages = consumer.consume(batch, 1.0)
        if messages and not first:
            first = time.monotonic()
        runs: dict[tuple[str, int], list[_Record]] = {}
        for msg in messages:
            if msg.error() is None:
                record = _record(msg)
                runs.setdefault((record.topic, record.partition), []).append(record)
        for tp, records in runs.items():
            handler(records)
            positions[tp] = records[-1].offset + 1
            seen += len(records)
            since_commit += len(records)
        if since_commit >= every or (since_commit and time.monotonic() - last_commit >= interval):
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()], asynchronous=True)
            since_commit, last_commit = 0, time.monotonic()
    elapsed = time.monotonic() - first
    emit("done", count=seen, seconds=elapsed, rate=seen / elapsed)
    consumer.close()


def _fails(record: _Record) -> None:
    raise RuntimeError(f"record {record.offset} failed")


class _Stacks:
    """The stack text of a failure, formatted once per site (the frames' code and line numbers)."""

    def __init__(self) -> None:
        self._texts: dict[tuple[object, ...], str] = {}

    def text(self, exc: BaseException) -> str:
        frames = list(traceback.walk_tb(exc.__traceback__))
        site = (type(exc), *((f.f_code, line) for f, line in frames))
        text = self._texts.get(site)
        if text is None:
            text = self._texts[site] = "".join(traceback.StackSummary.extract(iter(frames)).format())
        return text


def _retry_headers(record: _Record, exc: BaseException, stack: str, group: str, now_ms: int) -> list[tuple[str, bytes]]:
    """The 16 headers of a first retry (the values retrytopics writes; docs/headers.md)."""
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    message = str(exc)
    now = str(now_ms).encode()
    return [
        ("retry.schema_version", b"1"),
        ("retry.reconsume_times", b"1"),
        ("retry.origin_message_id", f"{record.topic}-{record.partition}-{record.offset}".encode()),
        ("retry.original_topic", record.topic.encode()),
        ("retry.original_partition", str(record.partition).encode()),
        ("retry.original_offset", str(record.offset).encode()),
        ("retry.original_timestamp", str(record.timestamp_ms).encode()),
        ("retry.consumer_group", group.encode()),
        ("retry.tier", b"0"),
        ("retry.due_at", str(now_ms + 3_600_000).encode()),
        ("retry.first_failed_at", now),
        ("retry.last_failed_at", now),
        ("retry.exception_type", name.encode()),
        ("retry.exception_message", message.encode()),
        ("retry.exception_trace", f"{stack}{name}: {message}\n".encode()),
        ("retry.replay_count", b"0"),
    ]


def floor_failure(args: dict[str, Any]) -> None:
    """Consume `n` records of `topic`; each handler call raises; republish each record to `tier` with its
    retry headers; commit a partition's position once the republishes before it are acknowledged. Time
    from the first handler call to the n-th acknowledgement.

    Args: bootstrap, topic, tier, group, n, batch, consumer_overrides.
    """
    consumer = _consumer(args)
    producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": args["bootstrap"]})
    producer.list_topics(args["tier"], timeout=10)  # metadata up front, as a long-running runtime has it
    tier, group, n, stacks = args["tier"], args["group"], args["n"], _Stacks()
    pending: dict[tuple[str, int], set[int]] = {}  # per partition: offsets republished, not yet acknowledged
    consumed: dict[tuple[str, int], int] = {}  # per partition: the next offset to read
    committed: dict[tuple[str, int], int] = {}
    count, first = [0], 0.0

    def delivered(waiting: set[int], offset: int) -> Callable[[Any, Any], None]:
        def report(err: Any, _msg: Any) -> None:
            if err is not None:
                raise RuntimeError(f"republish failed: {err}")
            waiting.discard(offset)
            count[0] += 1

        return report

    emit("ready")
    while count[0] < n:
        for msg in consumer.consume(args["batch"], 0.1):
            if msg.error() is not None:
                continue
            if not first:
                first = time.monotonic()
            record = _record(msg)
            tp = (record.topic, record.partition)
            consumed[tp] = record.offset + 1
            try:
                _fails(record)
            except Exception as exc:  # noqa: BLE001 - every handler failure is republished
                headers = _retry_headers(record, exc, stacks.text(exc), group, int(time.time() * 1000))
                waiting = pending.setdefault(tp, set())
                waiting.add(record.offset)
                producer.produce(
                    tier,
                    value=record.value,
                    key=record.key,
                    headers=headers,
                    on_delivery=delivered(waiting, record.offset),
                )
        producer.poll(0)
        # at-least-once: a position never passes a republish that is not acknowledged
        positions = {tp: min(pending[tp]) if pending.get(tp) else end for tp, end in consumed.items()}
        moved = {tp: o for tp, o in positions.items() if committed.get(tp) != o}
        if moved:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in moved.items()], asynchronous=True)
            committed.update(moved)
    elapsed = time.monotonic() - first
    emit("done", count=count[0], seconds=elapsed, rate=n / elapsed)
    producer.flush(30)
    consumer.close()
