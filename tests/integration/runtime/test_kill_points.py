"""SIGKILL of a main-consumer process at each point of a hand-off, then a restart (at-least-once mode).

A worker process (`fault_worker.py`) runs the main consumer; the tier consumers run in this process for the
whole scenario. The worker first handles and commits records 0-4, then record 5 meets its kill point:

- `in_handler`: SIGKILL inside the failing handler, before anything was republished;
- `after_retry_ack`: SIGKILL right after the broker acknowledged record 5's republish to the tier, before
  its source offset could be committed;
- `after_dlq_ack`: the same, for a non-retryable record's DLQ publish.

Guarantees: the kill never moved the commit past record 5; the restart starts from the last commit (5: records
0-4 are not handled again); nothing is lost; and nothing is written downstream twice. The restart, seeded
from the tail of the tier and the DLQ when its partition is assigned (runtime/records/duplicates.py), finds the hop the
killed worker wrote and suppresses record 5 (neither handled nor handed off again): one copy in the tier,
one DLQ record. Before the seeding the restart wrote a second copy to the tier (suppressed by
the tier's in-memory audit) and a second, identical DLQ record.

The three scenarios run side by side (one source and group each), so the slow part, the dead member's
session running out before the restart can join, is paid once.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, RetryHeaders, decode

from .conftest import Kit, Read, wait_until
from .fault_worker import build_app, read_ledger, spawn

pytestmark = pytest.mark.broker

#: A short session: the restart joins only once the killed member's session ran out.
CONSUMER = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 500}
KILLED = 5  # offset and id of the record whose hand-off is interrupted
SCENARIOS = {  # name: (behaviour of record 5, the event whose first occurrence SIGKILLs the worker)
    "in_handler": ("kill", None),
    "after_retry_ack": ("fail", "retry.scheduled"),
    "after_dlq_ack": ("bad", "dlq.dispatched"),
}


@dataclass
class Run:
    settings: dict[str, Any]
    behaviour: str
    tiers: RetryApp
    restarted: RetryApp
    dir: Path
    kit: Kit
    worker: subprocess.Popen[bytes] | None = None
    worker_status: int | None = None
    committed_after_kill: dict[int, int] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return str(self.settings["source"])

    def calls(self, who: str) -> list[tuple[str, int]]:
        return [(e["id"], e["attempt"]) for e in read_ledger(self.dir / f"{who}.jsonl")]

    def topic(self, which: str) -> list[Read]:
        topics = self.tiers.topics(self.source)
        return self.kit.read_all(topics.dlq if which == "dlq" else topics.tiers[0].topic)

    def headers(self, which: str) -> list[RetryHeaders]:
        """Decoded retry headers of record 5's copies in the tier or the DLQ."""
        return [decode(list(r.headers)) for r in self.topic(which) if r.value == f"{KILLED}:{self.behaviour}".encode()]


def _start(name: str, kafka: KafkaConfig, kit: Kit, base: Path) -> Run:
    suffix = uuid.uuid4().hex[:8]
    behaviour, kill_on = SCENARIOS[name]
    directory = base / name
    directory.mkdir()
    settings = {
        "name": name,
        "bootstrap": kafka.bootstrap,
        "group": f"kill-{name}-{suffix}",
        "source": kit.create(f"kill-{name}-{suffix}", 1),
        "consumer": CONSUMER,
        "delays": ["300ms"],
        "ledger": str(directory / "worker.jsonl"),
        "log": str(directory / "worker.log"),
        "kill_on": kill_on,
    }
    run = Run(
        settings=settings,
        behaviour=behaviour,
        tiers=build_app(settings, str(directory / "tiers.jsonl")),
        restarted=build_app(settings, str(directory / "restarted.jsonl")),
        dir=directory,
        kit=kit,
    )
    run.tiers.provision()
    run.tiers.start(main=False, tiers="all")
    kit.produce(run.source, [(None, f"{i}:ok".encode(), []) for i in range(KILLED)])
    run.worker = spawn(settings)
    return run


def _finished(run: Run, kit: Kit) -> bool:
    if kit.committed(run.settings["group"], run.source, 1) != {0: KILLED + 3}:
        return False
    name = run.settings["name"]
    if name == "in_handler":
        return (str(KILLED), 2) in run.calls("tiers")
    if name == "after_retry_ack":
        return run.restarted.stats.duplicates_suppressed >= 1 and len(run.topic("dlq")) >= 1
    return run.restarted.stats.duplicates_suppressed >= 1


@pytest.fixture(scope="module")
def runs(kafka: KafkaConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    kit = Kit(kafka)
    base = tmp_path_factory.mktemp("kill-points")
    started: list[Run] = []
    try:
        for name in SCENARIOS:
            started.append(_start(name, kafka, kit, base))
        for run in started:  # records 0-4 handled and committed by the worker
            wait_until(
                lambda run=run: kit.committed(run.settings["group"], run.source, 1) == {0: KILLED},
                30,
                f"{run.settings['name']}: the first commit",
            )
        for run in started:
            kit.produce(
                run.source, [(None, f"{KILLED}:{run.behaviour}".encode(), []), (None, b"6:ok", []), (None, b"7:ok", [])]
            )
        for run in started:
            assert run.worker is not None
            run.worker_status = run.worker.wait(30)
            run.committed_after_kill = kit.committed(run.settings["group"], run.source, 1)
        for run in started:
            run.restarted.start(main=True)
        for run in started:
            wait_until(lambda run=run: _finished(run, kit), 60, f"{run.settings['name']}: the restart to finish")
        for run in started:
            assert run.restarted.stop() and run.tiers.stop()
        yield {run.settings["name"]: run for run in started}
    finally:
        for run in started:
            if run.worker is not None:
                run.worker.kill()
                run.worker.wait(10)
            run.restarted.stop()
            run.tiers.stop()


def _assert_killed_then_resumed_from_the_last_commit(run: Run, *, handed_off: bool) -> None:
    assert run.worker_status == -signal.SIGKILL, Path(run.settings["log"]).read_text()
    assert run.committed_after_kill == {0: KILLED}  # never past the record whose hand-off was interrupted
    worker_ids = [i for i, _ in run.calls("worker")]
    assert worker_ids[: KILLED + 1] == [str(i) for i in range(KILLED + 1)]
    # the restart starts at the last commit: records 0-4 are not handled again, 6-7 are, and 5 too unless
    # the killed worker's hand-off of it is downstream already (then it is suppressed)
    again = [] if handed_off else [(str(KILLED), 1)]
    assert run.calls("restarted") == [*again, ("6", 1), ("7", 1)]
    assert run.restarted.stats.duplicates_suppressed == int(handed_off)


def test_sigkill_inside_a_failing_handler_loses_nothing(runs: dict[str, Run]) -> None:
    run = runs["in_handler"]
    _assert_killed_then_resumed_from_the_last_commit(run, handed_off=False)
    assert run.calls("worker") == [(str(i), 1) for i in range(KILLED + 1)]  # killed before raising
    # then: one republish (the restart's), handled once by the tier, where it succeeds; no DLQ
    (hop,) = run.headers("tier")
    assert (hop.origin_message_id, hop.reconsume_times) == (f"{run.source}-0-{KILLED}", 1)
    assert run.calls("tiers") == [(str(KILLED), 2)]
    assert run.topic("dlq") == []


def test_sigkill_after_the_retry_ack_writes_the_hop_once(runs: dict[str, Run]) -> None:
    run = runs["after_retry_ack"]
    _assert_killed_then_resumed_from_the_last_commit(run, handed_off=True)
    # then: one copy of the hop in the tier (the worker's, acknowledged; the restart suppressed record 5) ...
    (hop,) = run.headers("tier")
    assert (hop.origin_message_id, hop.lineage.replay_count, hop.reconsume_times) == (f"{run.source}-0-{KILLED}", 0, 1)
    # ... handled once by the tier: one DLQ record for the id
    assert run.calls("tiers") == [(str(KILLED), 2)]
    assert run.tiers.stats.duplicates_suppressed == 0
    (dead,) = run.headers("dlq")
    assert (dead.origin_message_id, dead.dlq_reason, dead.reconsume_times) == (
        f"{run.source}-0-{KILLED}",
        DlqReason.EXHAUSTED,
        2,
    )


def test_sigkill_after_the_dlq_ack_writes_one_dlq_record(runs: dict[str, Run]) -> None:
    run = runs["after_dlq_ack"]
    _assert_killed_then_resumed_from_the_last_commit(run, handed_off=True)
    # then: one DLQ record (without the seeding at assignment, the restart wrote a second, identical one)
    (dead,) = run.headers("dlq")
    assert (dead.origin_message_id, dead.lineage.replay_count, dead.reconsume_times, dead.dlq_reason) == (
        f"{run.source}-0-{KILLED}",
        0,
        1,
        DlqReason.NON_RETRYABLE,
    )
    assert [r.value for r in run.topic("tier")] == []
    assert run.calls("tiers") == []
