"""The raw baselines: what a careful user writes by hand with confluent-kafka, run as child roles.

Both use the product's client defaults (`connectors.kafka.CONSUMER_DEFAULTS` / `PRODUCER_DEFAULTS`) and the
same overrides as the runtime under test, so that a ratio measures the runtime, not a configuration.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.measure import emit
from retrytopics.connectors.kafka import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS

__all__ = ["raw_consume", "raw_paused", "raw_produce", "raw_read", "raw_window"]


def _noop(msg: Message) -> None:
    return None


def raw_consume(args: dict[str, Any]) -> None:
    """Consume `n` records of `topic` in batches, call a no-op per record, and commit the handled positions
    asynchronously every `commit_every` records or `commit_interval_s` seconds (the runtime's policy).

    Args: bootstrap, topic, group, n, batch, commit_every, commit_interval_s, consumer_overrides.
    """
    consumer = Consumer(
        {
            **CONSUMER_DEFAULTS,
            "bootstrap.servers": args["bootstrap"],
            "group.id": args["group"],
            **args.get("consumer_overrides", {}),
        }
    )
    consumer.subscribe([args["topic"]])
    n, batch, handler = args["n"], args["batch"], _noop
    every, interval = args["commit_every"], args["commit_interval_s"]
    seen, first, since_commit, last_commit = 0, 0.0, 0, time.monotonic()
    positions: dict[tuple[str, int], int] = {}
    emit("ready")
    while seen < n:
        messages = consumer.consume(batch, 1.0)
        if messages and not first:
            first = time.monotonic()
            emit("first")
        for msg in messages:
            if msg.error() is not None:
                continue
            handler(msg)
            positions[(msg.topic(), msg.partition())] = msg.offset() + 1
            seen += 1
            since_commit += 1
        if since_commit >= every or (since_commit and time.monotonic() - last_commit >= interval):
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()], asynchronous=True)
            since_commit, last_commit = 0, time.monotonic()
    elapsed = time.monotonic() - first
    emit("done", count=seen, seconds=elapsed, rate=seen / elapsed)
    consumer.close()


def raw_produce(args: dict[str, Any]) -> None:
    """Produce `n` copies of one record (value and headers of the given sizes) with an idempotent, acks=all
    producer; time from the first produce call to the n-th acknowledgement.

    Args: bootstrap, topic, n, partitions, value_size, headers (list of [key, value-text]), producer_overrides.
    """
    producer = Producer(
        {**PRODUCER_DEFAULTS, "bootstrap.servers": args["bootstrap"], **args.get("producer_overrides", {})}
    )
    topic, n = args["topic"], args["n"]
    value = b"v" * args["value_size"]
    headers = [(k, v.encode()) for k, v in args["headers"]]
    acked = [0]

    def report(err: object, _msg: object) -> None:
        if err is None:
            acked[0] += 1

    producer.list_topics(topic, timeout=10)  # metadata up front, as a long-running runtime has it
    emit("ready")
    start = time.monotonic()
    for i in range(n):
        while True:
            try:
                producer.produce(
                    topic, value=value, headers=headers, partition=i % args["partitions"], on_delivery=report
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)
    elapsed = time.monotonic() - start
    if acked[0] != n:
        raise RuntimeError(f"only {acked[0]} of {n} records acknowledged")
    emit("done", count=acked[0], seconds=elapsed, rate=n / elapsed)


def raw_paused(args: dict[str, Any]) -> None:
    """A hand-written delay consumer: on the first record of each partition (none is due), pause the
    partition and seek back to that record; report "paused" when all `partitions` are; then keep polling
    (1 s timeout, like the runtime's longest wait) until terminated.

    Args: bootstrap, topic, group, partitions, consumer_overrides.
    """
    consumer = Consumer(
        {
            **CONSUMER_DEFAULTS,
            "bootstrap.servers": args["bootstrap"],
            "group.id": args["group"],
            **args.get("consumer_overrides", {}),
        }
    )
    consumer.subscribe([args["topic"]])
    paused: set[int] = set()
    emit("ready")
    try:
        while True:
            for msg in consumer.consume(500, 1.0):
                if msg.error() is not None or msg.partition() in paused:
                    continue
                tp = TopicPartition(msg.topic(), msg.partition(), msg.offset())
                consumer.pause([tp])
                consumer.seek(tp)
                paused.add(msg.partition())
                if len(paused) == args["partitions"]:
                    emit("paused", paused=len(paused))
    finally:
        consumer.close()


def raw_read(args: dict[str, Any]) -> None:
    """Read `n` records of `topic` from the beginning with one assign()-only consumer (no group), touching
    each value, as a single-process reader would. Args: bootstrap, topic, partitions, n."""
    consumer = Consumer({**CONSUMER_DEFAULTS, "bootstrap.servers": args["bootstrap"], "group.id": "bench-raw-read"})
    consumer.assign([TopicPartition(args["topic"], p, 0) for p in range(args["partitions"])])
    n, seen, size = args["n"], 0, 0
    emit("ready")
    start = time.monotonic()
    while seen < n:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error() is None:
                size += len(msg.value() or b"")
                seen += 1
    elapsed = time.monotonic() - start
    emit("done", count=seen, seconds=elapsed, rate=seen / elapsed, bytes=size)
    consumer.close()


def raw_window(args: dict[str, Any]) -> None:
    """The hand-written floor of handler concurrency: asyncio + confluent-kafka, at most `concurrency` calls in
    flight, one in flight per key (a key's later records wait in offset order), a failing call's record
    produced to a retry topic, offsets committed up to the contiguous prefix of settled records every 500
    settles or second. It reads only while the window has room, and no more than that room (librdkafka keeps
    fetching ahead meanwhile, within its own queue bounds: no pause, no refetch). The handler awaits `handler_ms`; records whose offset % 10 == 3 fail.
    Done after `n` records settled. Args: bootstrap, topic, retry_topic, group, n, concurrency, handler_ms."""
    import asyncio
    import collections

    async def main() -> tuple[int, float]:
        consumer = Consumer(
            {
                **CONSUMER_DEFAULTS,
                "bootstrap.servers": args["bootstrap"],
                "group.id": args["group"],
                **args.get("consumer_overrides", {}),
            }
        )
        producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": args["bootstrap"]})
        consumer.subscribe([args["topic"]])
        limit, sleep_s, n = args["concurrency"], args["handler_ms"] / 1000, args["n"]
        admitted = 0  # in flight or waiting for their key
        busy: dict[bytes | None, collections.deque[Message]] = {}
        unsettled: dict[tuple[str, int], collections.deque[int]] = {}  # offsets read, in order
        settled: set[tuple[str, int, int]] = set()
        positions: dict[tuple[str, int], int] = {}
        done, first, since_commit, last_commit = 0, 0.0, 0, time.monotonic()
        tasks: set[asyncio.Task[None]] = set()

        def start(msg: Message) -> None:
            task = asyncio.get_running_loop().create_task(call(msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        async def call(msg: Message) -> None:
            nonlocal admitted, done, since_commit
            await asyncio.sleep(sleep_s)
            if msg.offset() % 10 == 3:
                producer.produce(args["retry_topic"], value=msg.value(), key=msg.key(), headers=msg.headers())
            tp = (msg.topic(), msg.partition())
            settled.add((*tp, msg.offset()))
            order = unsettled[tp]
            while order and (*tp, order[0]) in settled:
                settled.discard((*tp, order[0]))
                positions[tp] = order.popleft() + 1
            admitted -= 1
            done += 1
            since_commit += 1
            waiting = busy[msg.key()]
            if waiting:
                start(waiting.popleft())
            else:
                del busy[msg.key()]

        emit("ready")
        while done < n:
            producer.poll(0)
            messages = consumer.consume(min(500, limit - admitted), 0) if admitted < limit else []
            if messages and not first:
                first = time.monotonic()
            for msg in messages:
                if msg.error() is not None:
                    continue
                unsettled.setdefault((msg.topic(), msg.partition()), collections.deque()).append(msg.offset())
                admitted += 1
                key = msg.key()
                if key in busy:
                    busy[key].append(msg)
                else:
                    busy[key] = collections.deque()
                    start(msg)
            if since_commit >= 500 or (since_commit and time.monotonic() - last_commit >= 1.0):
                commit = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
                if commit:
                    consumer.commit(offsets=commit, asynchronous=True)
                since_commit, last_commit = 0, time.monotonic()
            await asyncio.sleep(0 if messages else 0.001)
        elapsed = time.monotonic() - first
        producer.flush(30)
        consumer.close()
        return done, elapsed

    count, seconds = asyncio.run(main())
    emit("done", count=count, seconds=seconds, rate=count / seconds)
