"""Signals to a main-consumer process in the middle of a handler call (`fault_worker.py` runs `app.run()`).

Guarantees:

- SIGTERM mid-handler: the call finishes, but its failure is no verdict on the record (the shutdown may have
  caused it): the record is neither dead-lettered nor republished, the committed offset points at it, and
  the process exits 0. The next run handles it (here: dead-letters it, once).
- SIGTERM while a handler never returns, then a second SIGTERM: the process stops waiting for it and exits
  at once (status 0, one log line naming the consumer left behind); nothing is committed past the record
  in hand, and nothing is handed off for it. (Without a second signal it exits
  `STOP_TIMEOUT_S` after the first: tests/unit/test_stuck_calls.py.)
- SIGSTOP longer than the session, then SIGCONT (a zombie): meanwhile the group gave the partition to a
  replacement, which handles the record. When the zombie wakes inside the handler, the group coordinator
  refuses its commit, so it does not act on the record (no second DLQ record, nothing handled from its stale
  batch) and says so in one log line, without a stack trace. Nothing is lost.
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
from retrytopics.core.headers import DlqReason, decode

from .conftest import Kit, wait_until
from .fault_worker import build_app, read_ledger, spawn

pytestmark = pytest.mark.broker

RECORDS = ["0:ok", "1:ok", "2:ok", "3:block", "4:ok", "5:ok"]
BLOCKED = 3  # the offset (and id) of the record whose handler is interrupted


def _settings(
    kafka: KafkaConfig, unique_name: Callable[[str], str], tmp_path: Path, consumer: dict[str, Any], kit: Kit
) -> dict[str, Any]:
    source = kit.create(unique_name("orders"), 1)
    return {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer,
        "delays": ["200ms"],
        "ledger": str(tmp_path / "worker.jsonl"),
        "log": str(tmp_path / "worker.log"),
        "release": str(tmp_path / "release"),
    }


def _log(settings: dict[str, Any]) -> str:
    return Path(settings["log"]).read_text(errors="replace")


def _started(settings: dict[str, Any], ident: int) -> bool:
    return any(e["id"] == str(ident) for e in read_ledger(Path(settings["ledger"])))


def _dlq_state(kit: Kit, app: RetryApp, source: str) -> list[tuple[bytes | None, str, DlqReason | None, int]]:
    out = []
    for read in kit.read_all(app.topics(source).dlq):
        state = decode(list(read.headers))
        out.append((read.value, state.origin_message_id, state.dlq_reason, state.reconsume_times))
    return out


def test_sigterm_mid_handler_leaves_the_record_for_the_next_run(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    # setup
    settings = _settings(kafka, unique_name, tmp_path, consumer_overrides, kit)
    source = settings["source"]
    restarted = build_app({**settings, "release": None}, str(tmp_path / "restart.jsonl"))
    apps.append(restarted)
    restarted.provision()
    kit.produce(source, [(None, v.encode(), []) for v in RECORDS])
    worker = spawn(settings)
    try:
        # when: SIGTERM while the handler of record 3 runs; it fails once the signal was handled
        wait_until(lambda: _started(settings, BLOCKED), 30, "the worker to be inside the handler of record 3")
        os.kill(worker.pid, signal.SIGTERM)
        wait_until(lambda: "received SIGTERM" in _log(settings), 30, "the worker to handle SIGTERM")
        Path(settings["release"]).touch()
        assert worker.wait(30) == 0, _log(settings)
    finally:
        worker.kill()
        worker.wait(10)

    # then: no hand-off for the in-flight record, and the commit points at it
    assert kit.committed(settings["group"], source, 1) == {0: BLOCKED}
    assert kit.read_all(restarted.topics(source).dlq) == []
    assert kit.read_all(restarted.topics(source).tiers[0].topic) == []
    assert [e["id"] for e in read_ledger(Path(settings["ledger"]))] == ["0", "1", "2", "3"]
    assert f"{source}[0]@{BLOCKED} failed while stopping" in _log(settings) and "Traceback" not in _log(settings)

    # when: the next run
    restarted.start(main=True)
    wait_until(lambda: kit.committed(settings["group"], source, 1) == {0: len(RECORDS)}, 30, "the restart to finish")
    # then: it starts at the record and dead-letters it exactly once
    assert [e["id"] for e in read_ledger(tmp_path / "restart.jsonl")] == ["3", "4", "5"]
    assert _dlq_state(kit, restarted, source) == [(b"3:block", f"{source}-0-3", DlqReason.NON_RETRYABLE, 1)]


def test_a_second_sigterm_exits_at_once_when_a_handler_never_returns(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    # setup
    settings = _settings(kafka, unique_name, tmp_path, consumer_overrides, kit)
    source = settings["source"]
    app = build_app(settings, str(tmp_path / "unused.jsonl"))
    app.provision()
    kit.produce(source, [(None, v.encode(), []) for v in ["0:ok", "1:ok", "2:ok", "3:hang", "4:ok"]])
    worker = spawn(settings)
    try:
        # when: SIGTERM while the handler of record 3 never returns, then SIGTERM again
        wait_until(lambda: _started(settings, 3), 30, "the worker to be inside the handler of record 3")
        os.kill(worker.pid, signal.SIGTERM)
        wait_until(lambda: "received SIGTERM" in _log(settings), 30, "the worker to handle SIGTERM")
        os.kill(worker.pid, signal.SIGTERM)
        # then: it exits, cleanly, without waiting for the handler that never returns (a bound, not a speed)
        assert worker.wait(30) == 0, _log(settings)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    assert "did not stop before the second signal" in _log(settings) and "Traceback" not in _log(settings)
    # then: nothing committed past the record in hand (the records before it, in its batch, are not either:
    # their batch never ended), nothing handed off for it
    assert kit.committed(settings["group"], source, 1)[0] in (-1001, 1, 2, 3)  # -1001: none yet
    assert kit.read_all(app.topics(source).dlq) == [] and kit.read_all(app.topics(source).tiers[0].topic) == []


def test_a_consumer_frozen_past_its_session_does_not_act_when_it_wakes(
    kafka: KafkaConfig,
    kit: Kit,
    unique_name: Callable[[str], str],
    apps: list[RetryApp],
    tmp_path: Path,
) -> None:
    # setup: a short session, so that the frozen member is expelled quickly
    consumer = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 500}
    settings = _settings(kafka, unique_name, tmp_path, consumer, kit)
    source, group = settings["source"], settings["group"]
    replacement = build_app({**settings, "release": None}, str(tmp_path / "replacement.jsonl"))
    apps.append(replacement)
    replacement.provision()
    kit.produce(source, [(None, v.encode(), []) for v in RECORDS])
    zombie = spawn(settings)
    try:
        # when: the worker is frozen inside the handler of record 3, and a replacement joins the group
        wait_until(lambda: _started(settings, BLOCKED), 30, "the worker to be inside the handler of record 3")
        os.kill(zombie.pid, signal.SIGSTOP)
        replacement.start(main=True)
        wait_until(lambda: kit.committed(group, source, 1) == {0: len(RECORDS)}, 30, "the replacement to finish")
        assert _dlq_state(kit, replacement, source) == [(b"3:block", f"{source}-0-3", DlqReason.NON_RETRYABLE, 1)]
        # when: the zombie wakes up inside the handler, which then fails
        Path(settings["release"]).touch()
        os.kill(zombie.pid, signal.SIGCONT)
        wait_until(lambda: "record.abandoned" in _log(settings), 30, "the zombie to notice")
        os.kill(zombie.pid, signal.SIGTERM)
        assert zombie.wait(30) == 0, _log(settings)
    finally:
        zombie.kill()
        zombie.wait(10)
    assert replacement.stop()

    # then: the zombie's commit was refused and it acted on nothing: one DLQ record, nothing handled twice
    log = _log(settings)
    line = next(x for x in log.splitlines() if f"handling {source}[0]@{BLOCKED} took" in x)
    assert "no longer counts this consumer as a member" in line, line
    assert any(code in line for code in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION")), line
    assert "Traceback" not in log
    assert _dlq_state(kit, replacement, source) == [(b"3:block", f"{source}-0-3", DlqReason.NON_RETRYABLE, 1)]
    assert kit.read_all(replacement.topics(source).tiers[0].topic) == []
    zombie_calls = [e["id"] for e in read_ledger(Path(settings["ledger"]))]
    assert zombie_calls == ["0", "1", "2", "3"], "the zombie handled records of its stale batch"
    # then: nothing lost: every record was handled by the replacement from the last commit on
    replacement_calls = [e["id"] for e in read_ledger(tmp_path / "replacement.jsonl")]
    assert replacement_calls[-3:] == ["3", "4", "5"]
    assert kit.committed(group, source, 1) == {0: len(RECORDS)}
