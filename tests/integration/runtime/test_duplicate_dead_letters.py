"""A single kill of a consumer writes no duplicate dead letter in at-least-once mode.

Two ways a record used to reach the DLQ twice, each measured here on a real broker:

- a main consumer SIGKILLed in the middle of a backlog of non-retryable records, right after a DLQ
  acknowledgement: everything acknowledged since its last commit was handled and dead-lettered again by
  the restart (the loop committed every 500 records or every second; measured: 150 of 150 redone). Now the
  loop commits as soon as a poll delivered acks, and the restart, seeded from the DLQ's tail when its
  partition is assigned, suppresses the records whose DLQ record exists;
- a tier consumer restarted between two copies of one hop (a crash upstream duplicated the republish): its
  in-memory audit was empty, so the second copy was handled again and dead-lettered a second time. Now the
  restarted tier consumer finds the first copy's DLQ record in the DLQ's tail and suppresses the second.

Guarantee: exactly one DLQ record per source record, and nothing lost (the group's commit reaches the end).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from retrytopics.connectors.config import KafkaConfig

from .backlog_worker import spawn
from .conftest import Kit, wait_until
from .fault_worker import build_app, read_ledger

pytestmark = pytest.mark.broker

CONSUMER = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 500}
BACKLOG = 300
KILL_AFTER = 150  # the worker dies right after this many DLQ acknowledgements


def _settings(name: str, kafka: KafkaConfig, kit: Kit, directory: Path) -> dict[str, object]:
    suffix = uuid.uuid4().hex[:8]
    return {
        "name": name,
        "bootstrap": kafka.bootstrap,
        "group": f"dup-{name}-{suffix}",
        "source": kit.create(f"dup-{name}-{suffix}", 1),
        "consumer": CONSUMER,
        "delays": ["300ms"],
        "ledger": str(directory / "worker.jsonl"),
        "log": str(directory / "worker.log"),
    }


def test_a_kill_after_a_dlq_ack_in_a_backlog_writes_no_duplicate_dlq_record(
    kafka: KafkaConfig, kit: Kit, tmp_path: Path, apps: list
) -> None:
    # given: a backlog of non-retryable records, and a worker that dies after the 150th DLQ ack
    settings = _settings("backlog", kafka, kit, tmp_path)
    settings.update(kill_on="dlq.dispatched", kill_after=KILL_AFTER)
    restarted = build_app(settings, str(tmp_path / "restarted.jsonl"))
    apps.append(restarted)
    restarted.provision()
    source, dlq = str(settings["source"]), restarted.topics(str(settings["source"])).dlq
    kit.produce(source, [(None, f"{i}:bad".encode(), []) for i in range(BACKLOG)])
    worker = spawn(settings)
    assert worker.wait(60) != 0, Path(str(settings["log"])).read_text()
    in_dlq_at_kill = len(kit.read_all(dlq))
    # when: the main consumer restarts
    restarted.start(main=True)
    wait_until(lambda: kit.committed(str(settings["group"]), source, 1) == {0: BACKLOG}, 60, "the restart to finish")
    assert restarted.stop()
    # then: one DLQ record per source record, and the restart called the handler for none of those
    per_id = Counter(r.value for r in kit.read_all(dlq))
    duplicates = sum(per_id.values()) - len(per_id)
    worker_ids = {e["id"] for e in read_ledger(tmp_path / "worker.jsonl")}
    redone = [e["id"] for e in read_ledger(tmp_path / "restarted.jsonl") if e["id"] in worker_ids]
    print(
        f"\nbacklog kill: {in_dlq_at_kill} in the DLQ at the kill, {len(redone)} handler calls redone, "
        f"{duplicates} duplicate DLQ records, {restarted.stats.duplicates_suppressed} suppressed"
    )
    assert len(per_id) == BACKLOG
    assert duplicates == 0
    assert in_dlq_at_kill >= KILL_AFTER
    # a record whose DLQ write was still unacknowledged at the kill is handled again: at most what was in flight
    assert len(redone) <= len(worker_ids) - KILL_AFTER


def test_a_tier_consumer_restarted_between_two_copies_of_a_hop_dead_letters_once(
    kafka: KafkaConfig, kit: Kit, tmp_path: Path, apps: list
) -> None:
    # given: a record failed through the only tier into the DLQ, and the tier consumer stopped
    settings = _settings("tier-restart", kafka, kit, tmp_path)
    first = build_app(settings, str(tmp_path / "first.jsonl"))
    apps.append(first)
    first.provision()
    source = str(settings["source"])
    topics = first.topics(source)
    first.start(main=True, tiers="all")
    kit.produce(source, [(None, b"1:fail", [])])
    wait_until(lambda: len(kit.read_all(topics.dlq)) == 1, 30, "the first copy's DLQ record")
    assert first.stop()
    # ... and a second copy of the same hop in the tier, as a main consumer killed after its ack writes it
    (copy,) = kit.read_all(topics.tiers[0].topic)
    kit.produce(topics.tiers[0].topic, [(copy.key, copy.value, list(copy.headers))], partition=copy.partition)
    # when: a fresh tier consumer (an empty in-memory audit) reads the second copy
    second = build_app(settings, str(tmp_path / "second.jsonl"))
    apps.append(second)
    second.start(main=False, tiers="all")
    wait_until(
        lambda: second.stats.duplicates_suppressed or len(kit.read_all(topics.dlq)) > 1,
        30,
        "the second copy to be read",
    )
    assert second.stop()
    # then: it is suppressed, never handled: still one DLQ record
    dead = kit.read_all(topics.dlq)
    print(f"\ntier restart: {len(dead) - 1} duplicate DLQ records, {second.stats.duplicates_suppressed} suppressed")
    assert [r.value for r in dead] == [b"1:fail"]
    assert read_ledger(tmp_path / "second.jsonl") == []
    assert second.stats.duplicates_suppressed == 1
