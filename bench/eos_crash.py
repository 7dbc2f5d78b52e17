"""``python -m bench.eos_crash``: how late a tier record is after its exactly-once source process was SIGKILLed
with a transaction open, with the old defaults and the new ones (docs/operations.md, "Exactly-once after a
crash"). Standalone: it starts an Apache Kafka broker of its own and prints one line per case.

Each case runs the scenario of tests/integration/runtime/test_eos_crash_lateness.py: a main-consumer process
hands record 0 off inside a transaction, blocks in record 1's handler and is killed there; another process
takes over; a tier consumer reads the tier read_committed. The lateness is the tier handler's call time
minus the record's due time (set by the process that took over when it handed record 0 off again).

- old defaults: a random instance id (the new process has another one) and librdkafka's 60 s transaction
  timeout (with `max.poll.interval.ms` 50 s, which that timeout covers);
- new defaults, restarted: the new process has its predecessor's instance id (`RETRYTOPICS_INSTANCE_ID`,
  or a pod's `HOSTNAME`), and its start fences the dead producer;
- new defaults, replaced: another instance takes over; the dead transaction ends when its 30 s timeout runs
  out (checked by the broker every `transaction.abort.timed.out.transaction.cleanup.interval.ms`, 10 s).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from retrytopics import KafkaConfig
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.brokers import local_broker
from retrytopics.connectors.kafka import make_admin, make_producer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration" / "runtime"))
from fault_worker import build_app, read_ledger, spawn  # type: ignore[import-not-found]

CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
CASES = {
    "old defaults (random id, 60 s transaction timeout)": (
        "old",
        {"transaction.timeout.ms": 60_000},
        {"max.poll.interval.ms": 50_000},
        False,
    ),
    "new defaults, restarted with its instance id": ("new", {}, {}, True),
    "new defaults, replaced by another instance": ("replaced", {}, {}, False),
}


def _wait(predicate: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"nothing after {timeout_s}s")


def _case(
    kafka: KafkaConfig, folder: Path, name: str, producer: dict[str, Any], consumer: dict[str, Any], same_id: bool
) -> float:
    source = f"orders-{name}"
    ensure_topics(make_admin(kafka), [TopicSpec(name=source, partitions=1)])
    settings = {
        "bootstrap": kafka.bootstrap,
        "group": f"billing-{name}",
        "source": source,
        "consumer": {**CONSUMER, **consumer},
        "delays": ["200ms"],
        "ledger": str(folder / f"{name}.jsonl"),
        "log": str(folder / f"{name}.log"),
        "release": str(folder / "never"),
        "exactly_once": True,
        "producer": producer,
    }
    tiers = build_app(
        settings,
        str(folder / f"{name}-tiers.jsonl"),
        exactly_once=True,
        instance_id="tiers",
        producer_overrides=producer,
    )
    tiers.provision()
    tiers.start(main=False, tiers="all")
    writer = make_producer(kafka)
    for value in (b"0:fail", b"1:block"):
        writer.produce(source, value=value)
    writer.flush(30)
    first = spawn(settings, {"RETRYTOPICS_INSTANCE_ID": "replica-1"})
    _wait(lambda: any(e["id"] == "1" for e in read_ledger(Path(settings["ledger"]))), 60)
    time.sleep(0.5)  # record 0's hand-off reaches the broker (linger, AddPartitionsToTxn)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    second = spawn({**settings, "release": None}, {"RETRYTOPICS_INSTANCE_ID": "replica-1" if same_id else "replica-2"})
    try:
        call = _wait(
            lambda: next((e for e in read_ledger(folder / f"{name}-tiers.jsonl") if e["attempt"] == 2), None), 120
        )
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        tiers.stop(30)
    return float(call["at"] - call["due_at"])


def main() -> None:
    with local_broker("apache") as broker, tempfile.TemporaryDirectory() as folder:
        kafka = broker.kafka_config()
        for label, (name, producer, consumer, same_id) in CASES.items():
            lateness_ms = _case(kafka, Path(folder), name, producer, consumer, same_id)
            print(f"{label}: tier record {lateness_ms / 1000:.1f} s late", flush=True)


if __name__ == "__main__":
    main()
