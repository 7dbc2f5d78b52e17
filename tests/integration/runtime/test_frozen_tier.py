"""A tier consumer frozen past its session while records wait in its memory hands nothing off when it wakes
(catalogue scenario 5, with waiting in memory).

Guarantee: records of the 600 ms tier are fetched and wait in the tier process's memory; the process is
SIGSTOPped, a replacement takes the partition over and handles them; after SIGCONT the woken process never
calls the handler for them (it asks the group coordinator before touching records kept from before the
freeze, and librdkafka tells it of the loss only some ms after the wake). Each is handled once; none is lost.
The deterministic before/after proof is `tests/unit/test_loop.py`; this runs the real thing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState

from retrytopics import RetryApp
from retrytopics.connectors.config import KafkaConfig

from .conftest import Kit, wait_until
from .fault_worker import read_ledger

pytestmark = pytest.mark.broker

WORKER = Path(__file__).with_name("tier_worker.py")
WAITING = [3, 6, 9, 12]  # ids that fail twice (tier_worker.failures_planned), so they reach the 600 ms tier


def _members(kit: Kit, group: str) -> int:
    described = kit.admin.describe_consumer_groups([group], request_timeout=5)[group].result(timeout=10)
    return len(described.members) if described.state is ConsumerGroupState.STABLE else 0


def test_a_tier_consumer_frozen_with_records_in_memory_does_not_act_on_them(
    broker: Any,
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    if broker.is_tansu:
        pytest.skip("tansu's DescribeGroups does not report members, which tells when the woken process rejoined")
    sys.path.insert(0, str(WORKER.parent))
    from tier_worker import build_app  # type: ignore[import-not-found]

    # setup: main consumer and the 300 ms tier here; the 600 ms tier in a child process with a short session
    source = kit.create(unique_name("orders"), 1)
    consumer = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 500}
    settings = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer,
        "tier": "600ms",
        "ledger": str(tmp_path / "zombie.jsonl"),
        "commit_interval": "100ms",
        "commit_every": 1,
    }
    app = build_app(settings, str(tmp_path / "local.jsonl"))
    apps.append(app)
    app.provision()
    tier2 = app.topics(source).tiers[1].topic
    zombie_log = tmp_path / "zombie.log"
    with zombie_log.open("wb") as err:
        zombie = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(settings)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        app.start(main=True, tiers=["300ms"])
        # a first record through the zombie, so that it owns the partition and has handled something
        kit.produce(source, [(b"k", b"0", [])])
        wait_until(
            lambda: any(e["id"] == 0 for e in read_ledger(tmp_path / "zombie.jsonl")), 60, "the worker's first call"
        )

        # when: the next records reach the 600 ms tier; the worker fetches them and they wait in its memory
        kit.produce(source, [(b"k", str(i).encode(), []) for i in WAITING])
        wait_until(lambda: len(kit.read_all(tier2)) == 1 + len(WAITING), 30, "the records in the 600 ms tier")
        os.kill(zombie.pid, signal.SIGSTOP)
        replacement = build_app(settings, str(tmp_path / "replacement.jsonl"))
        apps.append(replacement)
        replacement.start(main=False, tiers=["600ms"])
        replaced = lambda: {e["id"] for e in read_ledger(tmp_path / "replacement.jsonl")}  # noqa: E731
        wait_until(lambda: set(WAITING) <= replaced(), 60, "the replacement to handle the waiting records")
        os.kill(zombie.pid, signal.SIGCONT)
        wait_until(lambda: _members(kit, tier2) == 2, 60, "the woken process to rejoin its group")
    finally:
        zombie.send_signal(signal.SIGCONT)
        zombie.terminate()
        zombie.wait(30)

    # then: the woken process called the handler for none of them; each was handled once, by the replacement
    zombie_calls = [e["id"] for e in read_ledger(tmp_path / "zombie.jsonl")]
    assert zombie_calls == [0], zombie_log.read_text(errors="replace")[-3000:]
    assert sorted(e["id"] for e in read_ledger(tmp_path / "replacement.jsonl")) == WAITING
    assert "Traceback" not in zombie_log.read_text(errors="replace")
