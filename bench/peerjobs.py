"""The peer scenario's two measured programs, as child roles: ``python -m bench.peerjobs <role> '<json args>'``.

Both do the same job on a source topic whose record values are ids 0..n-1, with tiers of 1 s and 5 s: an id
with `id % 100 == 0` fails every attempt (→ DLQ after the 5 s tier), an id with `id % 10 == 5` fails its first
attempt only, every other id succeeds at once. `app_peer` is a `RetryApp` with the product's defaults (main
and tier consumers in this process); `raw_peer` is the hand-rolled confluent-kafka program a user might write
instead. Both start their tier consumers first and their main consumer once every tier partition is
assigned, as in a deployment where the tiers run already; each reports "main" after the n-th handler call on
the source topic, then "done" once every id is settled (handled OK, or its DLQ publish acknowledged).

With `keys` (the key-ordering scenario, bench/scenarios/keyorder.py), id i has key `i % keys` and `app_peer`
runs with or without `KeyOrdering`; the main pass then ends at the source call of the last record of a key with
no failing id (records of failing keys may be handed off behind their head, never called on the source).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition

from bench.child import run_role
from bench.measure import emit
from retrytopics.app import RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS
from retrytopics.core.keyorder.config import DeadHeadPolicy, KeyOrdering
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.record import Record
from retrytopics.observe.events import Event

__all__ = ["DELAYS_MS", "always_fails", "app_peer", "raw_peer"]

DELAYS_MS = (1000, 5000)


def always_fails(i: int) -> bool:
    return i % 100 == 0


def _fails(i: int, attempt: int) -> bool:
    return always_fails(i) or (i % 10 == 5 and attempt == 1)


class _Tally:
    """What both programs count, from any of their threads: source calls, OK ids, DLQ acks and lateness."""

    def __init__(self, n: int, tier_partitions: int, keys: int | None = None) -> None:
        self.n, self.n_dead = n, sum(1 for i in range(n) if always_fails(i))
        # the source calls that end the main pass: every id, or (keyed) every id of a key none of whose ids fail
        failing_keys = set() if keys is None else {i % keys for i in range(n) if _fails(i, 1)}
        self.main_calls = n if keys is None else sum(1 for i in range(n) if i % keys not in failing_keys)
        self.failing_keys, self.keys = failing_keys, keys
        self.first = self.main_at = self.done_at = 0.0
        self.main_cpu_s = 0.0  # CPU time of the thread that made the source calls, over the main pass
        self.source_calls = self.ok_calls = self.dead = self.assigned = 0
        self.ok: set[int] = set()
        self.lateness_ms: list[float] = []
        self.tiers, self.main, self.done = threading.Event(), threading.Event(), threading.Event()
        self._tier_partitions = tier_partitions
        self._lock = threading.Lock()

    def tier_assigned(self, partitions: int) -> None:
        with self._lock:
            self.assigned += partitions
            if self.assigned >= self._tier_partitions:
                self.tiers.set()

    def called(self, i: int, source: bool, due_at: int | None) -> None:
        """A handler call on id `i` starts: on the source, the main pass's clock; on a tier, the record's
        lateness (a record with a due time: a follower handed off behind its key's head has none)."""
        if not source:
            if due_at is not None:
                self.lateness_ms.append(time.time() * 1000 - due_at)
            return
        if self.keys is not None and i % self.keys in self.failing_keys:
            return
        with self._lock:
            self.source_calls += 1
            if self.source_calls == 1:
                self.first, self.main_cpu_s = time.monotonic(), -time.thread_time()
            elif self.source_calls == self.main_calls:
                self.main_at = time.monotonic()
                self.main_cpu_s += time.thread_time()
                self.main.set()

    def handled_ok(self, i: int) -> None:
        with self._lock:
            self.ok.add(i)
            self.ok_calls += 1
            self._check_done()

    def dead_lettered(self) -> None:
        with self._lock:
            self.dead += 1
            self._check_done()

    def _check_done(self) -> None:
        if len(self.ok) == self.n - self.n_dead and self.dead == self.n_dead and not self.done.is_set():
            self.done_at = time.monotonic()
            self.done.set()

    def serve(self, start_main: Callable[[], None], stop: Callable[[], object], timeout_s: float) -> None:
        """Start the main consumer once the tiers are assigned, wait for the main pass and the end, `stop`."""
        try:
            for name, event in (("tiers", self.tiers), ("main", self.main), ("end", self.done)):
                if not event.wait(timeout_s):
                    raise TimeoutError(
                        f"no {name} after {timeout_s}s: {self.assigned} tier partitions assigned, "
                        f"{self.source_calls} of {self.main_calls} source records called, {len(self.ok)} ids "
                        f"OK, {self.dead} dead-lettered"
                    )
                if event is self.tiers:
                    start_main()
                emit(name)
        finally:
            stop()

    def report(self) -> None:
        main_s = self.main_at - self.first
        emit(
            "done",
            main_s=main_s,
            main_rate=self.n / main_s,
            main_calls=self.main_calls,
            main_cpu_s=self.main_cpu_s,
            end_s=self.done_at - self.first,
            ok=len(self.ok),
            ok_calls=self.ok_calls,
            dead=self.dead,
            not_ok=sorted(set(range(self.n)) - self.ok),
            lateness_ms=[round(x, 3) for x in self.lateness_ms],
        )


# -- retrytopics -------------------------------------------------------------------------------------------


class _Watch:
    """Counts the tier consumers' assigned partitions and the acknowledged DLQ publishes."""

    wanted_events = frozenset({Event.PARTITIONS_ASSIGNED, Event.DLQ_DISPATCHED})

    def __init__(self, tally: _Tally, tier_topics: list[str]) -> None:
        self._tally, self._tier_topics = tally, set(tier_topics)

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        if event is Event.DLQ_DISPATCHED:
            self._tally.dead_lettered()
        elif data["consumer"] in self._tier_topics:  # a tier consumer is named after its topic
            self._tally.tier_assigned(len(data["partitions"]))  # type: ignore[arg-type]


def app_peer(args: dict[str, Any]) -> None:
    """A RetryApp running the job on `topic` (its tiers and DLQ already exist). Args: bootstrap, topic,
    retry_topics (the app's tier topics), group, n, partitions, consumer_overrides, timeout_s; for the keyed
    job `keys` and `ordering` (a `DeadHeadPolicy` value, or None: no key ordering)."""
    keys, dead_head = args.get("keys"), args.get("ordering")
    tally = _Tally(args["n"], len(DELAYS_MS) * args["partitions"], keys)
    app = RetryApp(
        kafka=KafkaConfig(bootstrap=args["bootstrap"]),
        group=args["group"],
        consumer_overrides=args.get("consumer_overrides", {}),
        hooks=[_Watch(tally, args["retry_topics"])],
    )

    ordering = None if dead_head is None else KeyOrdering(dead_head=DeadHeadPolicy(dead_head))
    source = args["topic"]

    @app.handler(source, policy=RetryPolicy(delays=[f"{d}ms" for d in DELAYS_MS]), ordering=ordering)
    def handle(record: Record[bytes]) -> None:
        retry = record.retry
        i = int(record.raw_value or b"")
        tally.called(i, record.topic == source, None if retry is None else retry.due_at)
        if _fails(i, 1 if retry is None else retry.reconsume_times + 1):
            raise RuntimeError(f"id {i} failed")
        tally.handled_ok(i)

    if ordering is not None:
        app.provision()  # the key-state topic (the tiers and the DLQ exist already)
    app.start(main=False, tiers="all")
    tally.serve(lambda: app.start(main=True), app.stop, args["timeout_s"])
    tally.report()


# -- the hand-rolled peer ----------------------------------------------------------------------------------


def _peer_stage(args: dict[str, Any], stage: int, producer: Producer, tally: _Tally, stop: threading.Event) -> None:
    """Stage 0 consumes the source; stage k > 0 the k-th retry topic, sleeping until each record is due. A
    failure is produced to the next topic (retry topic or DLQ) with a due-time header; positions are
    committed after each batch without waiting for the acks (naive: a crash may lose those records)."""
    topics = [args["topic"], *args["retry_topics"], args["dlq"]]
    consumer = Consumer(
        {
            **CONSUMER_DEFAULTS,
            "bootstrap.servers": args["bootstrap"],
            "group.id": f"{args['group']}.{stage}",
            **args.get("consumer_overrides", {}),
        }
    )
    consumer.subscribe([topics[stage]], on_assign=lambda _c, tps: tally.tier_assigned(len(tps)) if stage else None)
    last = stage == len(DELAYS_MS)

    def acked(err: object, _msg: Message) -> None:
        if err is None and last:
            tally.dead_lettered()

    while not stop.is_set():
        positions: dict[tuple[str, int], int] = {}
        for msg in consumer.consume(500, 0.1):
            if msg.error() is not None:
                continue
            due = int(dict(msg.headers() or [])["due"]) if stage else None
            if due is not None and due / 1000 > time.time():
                time.sleep(due / 1000 - time.time())
            i = int(msg.value() or b"")
            tally.called(i, not stage, due)
            if _fails(i, stage + 1):
                next_due = int(time.time() * 1000) + DELAYS_MS[stage] if stage < len(DELAYS_MS) else 0
                producer.produce(
                    topics[stage + 1],
                    msg.value(),
                    partition=msg.partition(),
                    headers=[("due", str(next_due).encode())],
                    on_delivery=acked,
                )
            else:
                tally.handled_ok(i)
            positions[(msg.topic(), msg.partition())] = msg.offset() + 1
        producer.poll(0)
        if positions:
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()], asynchronous=True)
    consumer.close()


def raw_peer(args: dict[str, Any]) -> None:
    """The hand-rolled program: one thread per stage (source, each retry topic), one shared producer.
    Args: bootstrap, topic, retry_topics, dlq, group, n, partitions, consumer_overrides, timeout_s."""
    tally, stop = _Tally(args["n"], len(DELAYS_MS) * args["partitions"]), threading.Event()
    producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": args["bootstrap"]})
    threads = [
        threading.Thread(target=_peer_stage, args=(args, stage, producer, tally, stop), daemon=True)
        for stage in range(len(DELAYS_MS) + 1)
    ]
    for thread in threads[1:]:
        thread.start()

    def halt() -> None:
        stop.set()
        for thread in threads:
            if thread.ident is not None:  # the main stage starts only once the tiers are assigned
                thread.join(30)
        producer.flush(30)

    tally.serve(threads[0].start, halt, args["timeout_s"])
    tally.report()


_ROLES: dict[str, Callable[[dict[str, Any]], None]] = {"app_peer": app_peer, "raw_peer": raw_peer}


def main(argv: list[str]) -> int:
    """The protocol of bench/child.py, for the roles of this module."""
    return run_role(_ROLES[argv[0]], json.loads(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
