"""Key order under SIGKILLs at random moments of both roles, several times, in both delivery modes (slow: run
with `-m slow`, as the failover set; docs/key-ordering.md, section 9).

The main consumer and the tier consumers each run in a process of their own (key_order_worker.py, the
scenario of the other SIGKILL tests: a quarter of the keys fail once on even records, one record of a key fails
twice, one is dead-lettered as exhausted). Records keep arriving while a killer SIGKILLs a role chosen at random
after a random pause (so inside a call, a transaction, a rebalance, a key-state read, wherever it falls) and
starts it again (same instance id: with exactly-once its producer fences the killed one's). Then the kills stop.

Guarantee: every record ends (handled, or dead-lettered as its failures say: nothing `blocked_by_key`, no key
stuck) within two minutes of the last kill; the shared ledger shows no record handled before every earlier
record of its key was terminal; with exactly-once, a read_committed reader sees each dead letter once.

The ledger's dead letters come from `on_dead_letter`, called when the DLQ write is acknowledged: a kill between
that acknowledgement and the ledger write leaves a record in the DLQ topic that the ledger does not show. Such a
record counts as terminal from its last failed call (the latest moment its dead letter can have been written
is later, so this is the lenient reading for that record only), and the test says how many there were.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.config import KafkaConfig

from .conftest import Kit, wait_until
from .test_key_order import _assert_key_order, _ledger, _produce, _spawn_worker, _terminal, _worker_app

pytestmark = [pytest.mark.broker, pytest.mark.slow]

KEYS, SEQS = 12, 16
KILLS = 10


def _dead_letters(kit: Kit, dlq: str) -> list[tuple[int, int]]:
    return [tuple(int(p) for p in (r.value or b"").decode().split(":")) for r in kit.read_all(dlq)]  # type: ignore[misc]


def _with_unlogged_dead_letters(events: list[dict[str, Any]], in_dlq: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """The ledger, with a `dlq` entry after the last failed call of each record in the DLQ that it lacks."""
    logged = {(e["key"], e["seq"]) for e in events if e["what"] == "dlq"}
    last_fail = {(e["key"], e["seq"]): i for i, e in enumerate(events) if e["what"] == "fail"}
    added = {last_fail[r]: r for r in in_dlq - logged if r in last_fail}
    out: list[dict[str, Any]] = []
    for i, e in enumerate(events):
        out.append(e)
        if i in added:
            key, seq = added[i]
            out.append({"what": "dlq", "key": key, "seq": seq, "reason": "exhausted"})
    return out


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_random_sigkills_of_both_roles_keep_every_key_in_order_and_nothing_stuck(
    kafka: KafkaConfig,
    kit: Kit,
    apps: list[RetryApp],
    unique_name: Callable[[str], str],
    consumer_overrides: dict[str, Any],
    tmp_path: Path,
    exactly_once: bool,
) -> None:
    worker = _worker_app()
    seed = int(os.environ.get("RETRYTOPICS_SOAK_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    source = kit.create(unique_name("orders"), 2)
    ledger = tmp_path / "ledger.jsonl"
    base = {
        "bootstrap": kafka.bootstrap,
        "group": unique_name("billing"),
        "source": source,
        "consumer": consumer_overrides,
        "ledger": str(ledger),
        "exactly_once": exactly_once,
        "kill_after": None,
        "ordered": os.environ.get("RETRYTOPICS_SOAK_UNORDERED") is None,  # set: the oracle's own check
    }
    settings = {"main": {**base, "instance": "main"}, "tiers": {**base, "role": "tiers", "instance": "tiers"}}
    app = worker.build_app(base)
    app.provision()
    dlq = app.topics(source).dlq
    running = {role: _spawn_worker(s) for role, s in settings.items()}
    killed: list[str] = []

    def produce() -> None:
        for seq in range(SEQS):
            _produce(kit, source, KEYS, range(seq, seq + 1))
            time.sleep(0.6)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        # when: a role chosen at random is SIGKILLed after a random pause and started again, KILLS times
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 3.0))
            role = rng.choice(sorted(running))
            process = running[role]
            assert process.poll() is None, f"the {role} worker died on its own (exit {process.returncode})"
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
            killed.append(role)
            running[role] = _spawn_worker(settings[role])
        producer.join(60)
        every = {(k, s) for k in range(KEYS) for s in range(SEQS)}
        wait_until(
            lambda: _terminal(ledger) | set(_dead_letters(kit, dlq)) >= every,
            120,
            f"every record ended after the kills {killed} (seed {seed})",
        )
    finally:
        for process in running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in running.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)

    # then
    in_dlq = _dead_letters(kit, dlq)
    events = _with_unlogged_dead_letters(_ledger(ledger), set(in_dlq))
    _assert_key_order(events, every, worker.failures)
    if exactly_once:
        assert sorted(in_dlq) == sorted(set(in_dlq)), f"a dead letter committed twice (seed {seed})"
    print(
        f"seed {seed}: kills {killed}; {len(set(in_dlq)) - len({(e['key'], e['seq']) for e in _ledger(ledger) if e['what'] == 'dlq'})} dead letters unlogged"
    )
