"""Exactly-once after a SIGKILL: a restarted process does not leave the next tier waiting behind its dead
predecessor's open transaction.

A main-consumer process (`fault_worker.py`, `exactly_once`) hands record 0 off to the tier inside a
transaction, then blocks in the handler of record 1, so the transaction stays open on the broker; the test
SIGKILLs it there. Until that transaction ends, read_committed readers of the tier (the tier consumer) stop
in front of it, and so behind it every record written to the tier later. The process is started again
the way a deployment restarts it: no `instance_id` in the code, the same name in its environment
(`RETRYTOPICS_INSTANCE_ID`, as Kubernetes gives a pod `HOSTNAME`).

Guarantee: the restarted process's transactional ids are its predecessor's, so starting fences the dead
producer and aborts its transaction at once: the tier consumer handles record 0's new hand-off within
10 s of its due time (docs/operations.md, "Exactly-once after a crash"; with a random id the dead
transaction held it back until `transaction.timeout.ms` ran out, about 60 s with librdkafka's default).
Nothing is lost or doubled: record 0 reaches the DLQ after its tier attempt, record 1 as non-retryable,
each once in the read_committed view.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import decode

from .conftest import Kit, wait_until
from .fault_worker import build_app, read_ledger, spawn

pytestmark = pytest.mark.broker

#: the documented bound on a tier record's lateness after its source's process was killed and restarted
LATENESS_BOUND_MS = 10_000


def test_a_restarted_exactly_once_process_fences_its_dead_predecessor_at_once(
    broker: Any,
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    if broker.is_tansu:
        pytest.skip("tansu shows aborted records to read_committed readers: no reader waits behind a transaction")
    # setup: the tier consumer runs here; the main consumer in a process named by its environment
    source = kit.create(unique_name("orders"), 1)
    settings = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer_overrides,
        "delays": ["200ms"],
        "ledger": str(tmp_path / "worker.jsonl"),
        "log": str(tmp_path / "worker.log"),
        "release": str(tmp_path / "release"),
        "exactly_once": True,
    }
    tiers = build_app(settings, str(tmp_path / "tiers.jsonl"), exactly_once=True, instance_id="tiers")
    apps.append(tiers)
    tiers.provision()
    tier, dlq = tiers.topics(source).tiers[0].topic, tiers.topics(source).dlq
    tiers.start(main=False, tiers="all")
    kit.produce(source, [(None, b"0:fail", []), (None, b"1:block", [])])
    env = {"RETRYTOPICS_INSTANCE_ID": "replica-1"}
    first = spawn(settings, env)
    try:
        # when: killed with record 0's hand-off written in its open transaction
        wait_until(
            lambda: any(e["id"] == "1" for e in read_ledger(Path(settings["ledger"]))),
            60,
            "the worker to be inside the handler of record 1",
        )
        wait_until(lambda: kit.read_all(tier, isolation="read_uncommitted"), 30, "record 0's uncommitted hand-off")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        # when: started again, as a deployment restarts it
        second = spawn({**settings, "release": None}, env)
        try:
            tier_call = wait_until(
                lambda: next((e for e in read_ledger(tmp_path / "tiers.jsonl") if e["attempt"] == 2), None),
                60,
                "the tier consumer to handle record 0",
            )
            wait_until(lambda: len(kit.read_all(dlq)) >= 2, 30, "both records in the DLQ")
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(30)
    finally:
        if first.poll() is None:
            first.kill()

    # then: record 0's tier record was not held back behind the dead transaction
    lateness_ms = tier_call["at"] - tier_call["due_at"]
    print(f"tier record lateness after the restart: {lateness_ms:.0f} ms")
    assert tier_call["id"] == "0" and lateness_ms < LATENESS_BOUND_MS, tier_call
    # then: nothing lost or doubled in the read_committed views
    assert [r.value for r in kit.read_all(tier)] == [b"0:fail"]
    dead = sorted((r.value, decode(list(r.headers)).origin_message_id) for r in kit.read_all(dlq))
    assert dead == [(b"0:fail", f"{source}-0-0"), (b"1:block", f"{source}-0-1")]
