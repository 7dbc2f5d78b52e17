"""8. Peer scenario: 20,000 records, 10% fail once, 1% always, tiers 1 s → 5 s, done by a `RetryApp`
and by a hand-rolled confluent-kafka program (bench/peerjobs.py), one after the other on the same broker,
each in its own child process with its tier consumers running before its main consumer starts.

Figures: the main-topic pass (records/s from the first to the 20,000th handler call on the source topic; the
CPU time per record of the thread making those calls in `extra`), the end (seconds from the first source
record until every id is handled OK or acknowledged by the DLQ), and the lateness of tier records
(handled_at - due_at, wall clock, at the start of each tier handler call). Every run is accounted exactly:
19,800 ids handled OK, the 200 always-failing ids read back from the DLQ topic once each, none lost; a run
that does not add up fails the scenario. The peer is naive on purpose (it commits before its republishes are
acknowledged, and sleeps in its retry consumers until each record is due): it is the speed a user gives up.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.context import CONSUMER_OVERRIDES, Bench
from bench.load import create_topics, tier_topics
from bench.measure import Child
from bench.peerjobs import DELAYS_MS, always_fails
from bench.report import Result, Target, percentile
from retrytopics.connectors.kafka import PRODUCER_DEFAULTS

NAME = "8.peer"
N = 20_000
MAIN_RATIO_TARGET = 0.2  # the main pass against the hand-rolled peer's, round by round
ROUNDS = 3
LATENESS_P99_TARGET = 50.0  # ms
TIMEOUT_S = 120.0

Extra = dict[str, float | int | str | None]


def run(b: Bench) -> list[Result]:
    app: list[dict[str, Any]] = []
    peer: list[dict[str, Any]] = []
    for _ in range(ROUNDS):  # 20k in both modes, about 30 s a round: medians of three, each round a pair
        peer.append(run_side(b, "raw_peer"))
        app.append(run_side(b, "app_peer"))
    return _results(app, peer)


def run_side(b: Bench, role: str, *, keys: int | None = None, ordering: str | None = None) -> dict[str, Any]:
    """One program's run (`keys`, `ordering`: the key-ordering scenario's app, bench/peerjobs.py), accounted."""
    label = role if keys is None else f"{role}.keys.{ordering or 'unordered'}"
    source, group = b.name(f"peer.{label}"), b.name(label)
    if role == "app_peer":
        ts = tier_topics(source, group, DELAYS_MS)
        retry_topics, dlq = [t.topic for t in ts.tiers], ts.dlq
    else:
        retry_topics, dlq = [f"{source}.retry.{d}ms" for d in DELAYS_MS], f"{source}.dlq"
    create_topics(b.kafka, [source, *retry_topics, dlq], b.partitions)
    _fill_ids(b, source, N, keys)
    args: dict[str, Any] = {
        "bootstrap": b.bootstrap,
        "topic": source,
        "retry_topics": retry_topics,
        "dlq": dlq,
        "group": group,
        "n": N,
        "partitions": b.partitions,
        "consumer_overrides": CONSUMER_OVERRIDES,
        "timeout_s": TIMEOUT_S,
    }
    if keys is not None:
        args |= {"keys": keys, "ordering": ordering}
    started = time.monotonic()
    with Child("bench.peerjobs", role, args) as child:
        done = child.wait_for("done", timeout_s=2 * TIMEOUT_S + 30)
        child.join(timeout_s=60)
    done["wall_s"] = time.monotonic() - started
    dlq_ids = _read_ids(b, dlq)
    _account(label, done, dlq_ids)
    done["dlq_records"] = len(dlq_ids)
    done["tier_records"] = _records_in(b, retry_topics, b.partitions)
    if role == "app_peer" and ordering is not None:  # key order's records (compaction may have removed some)
        done["key_state_records"] = _records_in(b, [ts.key_state_topic], b.partitions)
    print(
        f"  {label}: main pass {done['main_rate']:,.0f} records/s ({1e6 * done['main_cpu_s'] / N:.0f} µs of CPU per "
        f"record in its thread), end {done['end_s']:.1f} s, "
        f"lateness p50/p99 {percentile(done['lateness_ms'], 50):.1f}/{percentile(done['lateness_ms'], 99):.1f} ms, "
        f"{done['ok_calls'] - done['ok']} duplicate OK calls, {done['tier_records']:,} tier records"
        + (f", {done['key_state_records']:,} key-state records" if "key_state_records" in done else "")
        + f", {done['wall_s']:.0f} s wall",
        flush=True,
    )
    return done


def _fill_ids(b: Bench, topic: str, n: int, keys: int | None = None) -> None:
    """Values are the ids 0..n-1 as text, round-robin over the partitions (with `keys`: key `i % keys` as text,
    each key in partition `key % partitions`); raises unless all are acknowledged."""
    producer = Producer(
        {**b.kafka.producer_config(), **PRODUCER_DEFAULTS, "linger.ms": 20, "batch.num.messages": 10_000}
    )
    failed: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    for i in range(n):
        k = i if keys is None else i % keys
        key = None if keys is None else b"%d" % k
        producer.produce(topic, value=b"%d" % i, key=key, partition=k % b.partitions, on_delivery=report)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(60) or failed:
        raise RuntimeError(f"loading {topic}: {len(failed)} records failed: {failed[:3]}")


def _records_in(b: Bench, topics: list[str], partitions: int) -> int:
    """How many records were written to `topics` (end minus start offsets, each of `partitions` partitions)."""
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench-peer-count", "enable.auto.commit": False})
    try:
        total = 0
        for topic in topics:
            for p in range(partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high - low
        return total
    finally:
        consumer.close()


def _read_ids(b: Bench, topic: str) -> list[int]:
    """Every value of `topic` as an id: read from the beginning until the end offsets are reached and a poll
    brings nothing more (a duplicate past an under-reported end offset would still be counted)."""
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench-peer-read", "enable.auto.commit": False})
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(b.partitions)]
        consumer.assign([TopicPartition(topic, p, 0) for p in range(b.partitions)])
        ids: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = [int(m.value()) for m in consumer.consume(1000, 0.5) if m.error() is None]
            ids += batch
            if not batch and len(ids) >= sum(ends):
                break
        return ids
    finally:
        consumer.close()


def _account(role: str, done: dict[str, Any], dlq_ids: list[int]) -> None:
    """Every id handled OK or dead-lettered, exactly: raises with the discrepancy otherwise."""
    dead = sorted(i for i in range(N) if always_fails(i))
    problems = []
    if done["ok"] != N - len(dead):
        problems.append(f"{done['ok']} ids handled OK, expected {N - len(dead)}")
    if sorted(dlq_ids) != dead:
        problems.append(
            f"{len(dlq_ids)} DLQ records ({len(set(dlq_ids))} distinct ids), expected the {len(dead)} "
            f"always-failing ids once each"
        )
    lost = set(done["not_ok"]) - set(dlq_ids)
    if lost:
        problems.append(f"{len(lost)} ids neither handled OK nor in the DLQ (lost), e.g. {sorted(lost)[:5]}")
    if problems:
        raise RuntimeError(f"{role}: the run does not add up: {'; '.join(problems)}")


def median(runs: list[dict[str, Any]], figure: str) -> float:
    """The median of one figure over rounds."""
    return float(statistics.median(r[figure] for r in runs))


def late(runs: list[dict[str, Any]], q: float) -> float:
    """The median over rounds of the q-th percentile of tier lateness."""
    return statistics.median(percentile(r["lateness_ms"], q) for r in runs)


def _results(app: list[dict[str, Any]], peer: list[dict[str, Any]]) -> list[Result]:
    main, peer_main = median(app, "main_rate"), median(peer, "main_rate")
    ratios = [a["main_rate"] / p["main_rate"] for a, p in zip(app, peer, strict=True)]
    rounds = f"median of {len(app)} rounds; " if len(app) > 1 else ""
    last = app[-1]
    counts: Extra = {
        "handled_ok": last["ok"],
        "dead_lettered": last["dlq_records"],
        "lost": N - last["ok"] - last["dlq_records"],
        "duplicate_ok_calls": max(r["ok_calls"] - r["ok"] for r in app),
        "app_wall_s": median(app, "wall_s"),
        "peer_wall_s": median(peer, "wall_s"),
    }
    lateness: Extra = {"peer_p50_ms": late(peer, 50), "peer_p99_ms": late(peer, 99), "peer_max_ms": late(peer, 100)}
    n_late = len(app[-1]["lateness_ms"])
    return [
        Result(
            scenario=f"{NAME}.main",
            n=N,
            value=main,
            unit="records/s",
            baseline=peer_main,
            note=f"{rounds}main-topic pass; baseline: the hand-rolled peer",
            extra={
                "peer_ratio": main / peer_main,
                "app_main_cpu_us": 1e6 * median(app, "main_cpu_s") / N,
                "peer_main_cpu_us": 1e6 * median(peer, "main_cpu_s") / N,
            },
        ),
        Result(
            scenario=f"{NAME}.main.ratio",
            n=N,
            value=statistics.median(ratios),
            unit="x the peer",
            target=Target(">=", MAIN_RATIO_TARGET),
            note=f"the median of {len(ratios)} ratios of main passes, app / hand-rolled peer, each round a pair "
            f"run one after the other ({', '.join(f'{r:.2f}' for r in ratios)})",
        ),
        Result(
            scenario=f"{NAME}.end",
            n=N,
            value=median(app, "end_s"),
            unit="s",
            baseline=median(peer, "end_s"),
            note="first source record to the last id settled (handled OK, or acknowledged by the DLQ); "
            "accounted exactly: 19,800 OK, 200 in the DLQ, none lost",
            extra=counts,
        ),
        Result(scenario=f"{NAME}.lateness.p50", n=n_late, value=late(app, 50), unit="ms", extra=lateness),
        Result(
            scenario=f"{NAME}.lateness.p99",
            n=n_late,
            value=late(app, 99),
            unit="ms",
            target=Target("<=", LATENESS_P99_TARGET),
            note=f"tier records, handled_at - due_at; target <= {LATENESS_P99_TARGET:g} ms; the peer's in extra",
            extra={**lateness, "max_ms": late(app, 100)},
        ),
    ]
