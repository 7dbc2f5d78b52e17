"""No stuck client call hides (runtime/bounded.py): a call that outlives its bound is abandoned in its thread
and the next one runs on a fresh thread; a consumer whose synchronous commit is stuck is closed only once
that commit returned. The same on Apache Kafka: tests/integration/runtime/test_stuck_calls.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from retrytopics.core.errors import KafkaClientError
from retrytopics.runtime.bounded import BoundedCalls, BoundedCommits, CallAbandoned

from .kit import eventually


def test_a_call_past_its_bound_is_abandoned_and_the_next_runs_on_a_fresh_thread() -> None:
    calls = BoundedCalls(timeout_s=0.2, name="test")
    forever = threading.Event()
    started = time.monotonic()
    with pytest.raises(CallAbandoned, match=r"stuck did not return within 0\.2 s"):
        calls.call("stuck", forever.wait)
    assert time.monotonic() - started < 2
    assert calls.call("quick", lambda x: x + 1, 41) == 42
    with pytest.raises(KafkaClientError, match="refused"):
        calls.call("failing", _raise, KafkaClientError("refused", code="X"))
    forever.set()


def _raise(exc: BaseException) -> None:
    raise exc


class _CommitBlocks:
    """A consumer whose synchronous commit waits for `release`."""

    max_poll_interval_ms = 300_000

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.committed: list[dict[Any, int]] = []
        self.closed = False

    def commit(self, offsets: dict[Any, int], *, asynchronous: bool) -> None:
        if not asynchronous:
            self.release.wait()
        self.committed.append(dict(offsets))

    def close(self) -> None:
        self.closed = True


def test_a_stuck_synchronous_commit_is_abandoned_and_its_consumer_closed_only_once_it_returned() -> None:
    release = threading.Event()
    consumer = _CommitBlocks(release)
    bounded = BoundedCommits(consumer, BoundedCalls(timeout_s=0.1, name="test"))  # type: ignore[arg-type]
    bounded.commit({("orders", 0): 1}, asynchronous=True)
    with pytest.raises(CallAbandoned):
        bounded.commit({("orders", 0): 2}, asynchronous=False)
    bounded.close()
    assert not consumer.closed  # the commit's thread is still inside it
    release.set()
    eventually(lambda: len(consumer.committed) == 2)
    bounded.close()
    assert consumer.closed
