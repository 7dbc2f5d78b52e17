"""SIGKILL of a tier-consumer process in the middle of its work, then a restart.

Guarantees: nothing is lost (every record succeeds); work the killed process did after its last commit is
done again (at-least-once), and every hop it had already republished reaches the next tier twice, where the
duplicate audit suppresses and counts each copy: the next tier's handler never runs twice for one hop, and
nothing is dead-lettered. No handler call happens before its due time. The killed process neither commits
on acknowledgements nor seeds its hand-off audit (`commit_on_ack=False`, `dedupe_seed=0`): that keeps the
duplicate hops, and tests the next tier's audit as the defence left when upstream cannot recognise a hop
(e.g. one older than the tail it seeds from; see test_duplicate_dead_letters.py for the seeded case).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.config import KafkaConfig

from .conftest import Kit, wait_until
from .fault_worker import read_ledger

pytestmark = pytest.mark.broker

WORKER = Path(__file__).with_name("tier_worker.py")
N = 150


def _spawn(settings: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(settings)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def test_sigkill_of_a_tier_consumer_loses_nothing(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(WORKER.parent))
    from tier_worker import build_app, failures_planned  # type: ignore[import-not-found]

    # setup: main consumer and tier 2 in this process; tier 1 in a child process that never commits on its own
    source = kit.create(unique_name("orders"), 2)
    settings = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer_overrides,
        "tier": "300ms",
        "ledger": str(tmp_path / "worker.jsonl"),
        "work_s": 0.01,
        "commit_interval": "1h",
        "commit_every": 10**6,
        "commit_on_ack": False,
        # no seeding: the duplicates it would prevent upstream are what the tier's audit is tested on
        "dedupe_seed": 0,
    }
    app = build_app(settings, str(tmp_path / "local.jsonl"))
    apps.append(app)
    app.provision()
    kit.produce(source, [(f"k{i}".encode(), str(i).encode(), []) for i in range(N)])
    worker = _spawn(settings)
    try:
        app.start(main=True, tiers=["600ms"])
        worker_log = tmp_path / "worker.jsonl"
        wait_until(lambda: len(read_ledger(worker_log)) >= 30, 30, "the worker to be mid-run")

        # when: SIGKILL, then a restart that commits normally
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        killed = {(e["id"], e["attempt"]) for e in read_ledger(worker_log)}
        worker = _spawn({**settings, "commit_interval": "1s", "commit_every": 500, "commit_on_ack": True})
        expected_ok = set(range(N))
        ok = lambda: {e["id"] for e in read_ledger(worker_log) + read_ledger(tmp_path / "local.jsonl") if e["ok"]}  # noqa: E731
        wait_until(lambda: ok() == expected_ok, 60, "every record to succeed")
        tier2 = app.topics(source).tiers[1].topic
        copies = Counter(
            (r.header("retry.origin_message_id"), r.header("retry.reconsume_times")) for r in kit.read_all(tier2)
        )
        duplicates = sum(c - 1 for c in copies.values())
        wait_until(lambda: app.stats.duplicates_suppressed == duplicates, 20, "every duplicate hop to be counted")
    finally:
        worker.kill()
        worker.wait(10)
        app.stop()

    calls = read_ledger(worker_log) + read_ledger(tmp_path / "local.jsonl")
    # then: the kill really interrupted work (some calls were redone) and duplicates reached tier 2
    redone = Counter((e["id"], e["attempt"]) for e in calls)
    assert any(redone[k] > 1 for k in killed), "the restart redid nothing: the kill came too late to test anything"
    assert duplicates >= 1 and app.stats.duplicates_suppressed == duplicates
    # then: tier 2 (in this process) handled each hop once; nothing early; nothing dead-lettered
    tier2_calls = Counter(e["id"] for e in read_ledger(tmp_path / "local.jsonl") if e["attempt"] == 3)
    assert set(tier2_calls) == {i for i in range(N) if failures_planned(i) == 2}
    assert set(tier2_calls.values()) == {1}
    assert all(e["at"] >= e["due_at"] for e in calls if e["due_at"] is not None)
    assert kit.read_all(app.topics(source).dlq) == []
    assert sum(app.stats.dead_lettered.values()) == 0
