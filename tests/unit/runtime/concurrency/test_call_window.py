"""What one loop's `CallWindow` does at a revocation and at shutdown (runtime/concurrency/stage.py): the calls in
flight of the revoked partitions are waited for up to the bound and their outcomes handed on before the commit;
their records not started never start; a call still running at the bound is abandoned, and what it returns
later is dropped (its record is read again by the new owner, never committed here)."""

from __future__ import annotations

import threading
from typing import Any

from retrytopics.connectors.serde import bytes_value
from retrytopics.core.concurrency import Concurrency
from retrytopics.core.ports import Message
from retrytopics.core.record import Record
from retrytopics.observe.events import Emitter
from retrytopics.runtime.concurrency.stage import CallWindow
from retrytopics.runtime.records.calls import Binding
from retrytopics.runtime.records.outcome import Outcome, Parked, Succeeded

from ..kit import CTX, eventually

P0, P1 = ("orders", 0), ("orders", 1)


class Handler:
    """Calls that return once their offset's gate is opened; the ones that started, in order."""

    def __init__(self) -> None:
        self.gates: dict[tuple[int, int], threading.Event] = {}
        self.started: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def gate(self, partition: int, offset: int) -> threading.Event:
        with self.lock:
            return self.gates.setdefault((partition, offset), threading.Event())

    def __call__(self, record: Record[bytes]) -> None:
        with self.lock:
            self.started.append((record.partition, record.offset))
        self.gate(record.partition, record.offset).wait(10)


def window_of(handler: Handler) -> tuple[CallWindow, Binding]:
    binding = Binding(
        topic="orders",
        handler=handler,
        policy=CTX.policy,
        ctx=CTX,
        value_deserializer=bytes_value,
        concurrency=Concurrency(calls=4),
    )

    def failed(*args: Any) -> Any:
        raise AssertionError(f"no call fails here: {args[-1]!r}")

    window = CallWindow({"orders": binding}, failed=failed, emitter=Emitter([]), consumer="t", stop=threading.Event())
    return window, binding


def admit(window: CallWindow, binding: Binding, partition: int, offset: int, key: bytes) -> list[Outcome]:
    msg = Message("orders", partition, offset, 0, key, b"v", ())
    return list(window.admit(binding, msg, None, None, None))


def test_a_revocation_waits_for_its_calls_hands_their_outcomes_on_and_never_starts_what_waited() -> None:
    handler = Handler()
    window, binding = window_of(handler)
    # P0: a@0 running, a@1 waiting behind its key, b@2 running; P1: c@0 running
    for partition, offset, key in [(0, 0, b"a"), (0, 1, b"a"), (0, 2, b"b"), (1, 0, b"c")]:
        assert admit(window, binding, partition, offset, key) == [
            Parked(Message("orders", partition, offset, 0, key, b"v", ()))
        ]
    window.wait_ms(0)  # hands the calls to the workers
    eventually(lambda: len(handler.started) == 3)
    handler.gate(0, 2).set()
    threading.Timer(0.2, handler.gate(0, 0).set).start()  # returns while the revocation waits
    applied: list[Outcome] = []
    window.settle_before_revoke([P0], 10.0, applied.append)
    window.revoked([P0])
    assert sorted((o.msg.partition, o.msg.offset) for o in applied if type(o) is Succeeded) == [(0, 0), (0, 2)]
    assert (0, 1) not in handler.started  # waited behind its key: never started, its offset never finished
    # P1's call goes on and counts
    handler.gate(1, 0).set()
    eventually(lambda: not window._workers.done.empty())
    assert [(o.msg.partition, o.msg.offset) for it in window.released() for o in it] == [(1, 0)]
    window.close()


def test_a_call_still_running_at_the_bound_is_abandoned_and_what_it_returns_later_is_dropped() -> None:
    handler = Handler()
    window, binding = window_of(handler)
    admit(window, binding, 0, 0, b"a")
    window.wait_ms(0)
    eventually(lambda: handler.started == [(0, 0)])
    applied: list[Outcome] = []
    window.settle_before_revoke([P0], 0.05, applied.append)
    window.revoked([P0])
    assert applied == []
    handler.gate(0, 0).set()
    eventually(lambda: not window._workers.done.empty())
    assert [o for it in window.released() for o in it] == []
    assert window.in_flight == 0
    window.close()


def test_shutdown_drains_the_calls_in_flight_and_starts_nothing_new() -> None:
    handler = Handler()
    window, binding = window_of(handler)
    admit(window, binding, 0, 0, b"a")
    admit(window, binding, 0, 1, b"a")
    window.wait_ms(0)
    eventually(lambda: handler.started == [(0, 0)])
    threading.Timer(0.1, handler.gate(0, 0).set).start()
    applied: list[Outcome] = []
    window.drain(10.0, applied.append)
    assert [(o.msg.offset) for o in applied] == [0] and handler.started == [(0, 0)]
    window.close()


def test_plain_calls_run_side_by_side_up_to_the_bound_on_daemon_threads() -> None:
    """Four calls of four keys, each returning only once all four started: the pool runs them together (and a
    call that never returns would not keep the process from exiting: its threads are daemons)."""
    handler = Handler()
    window, binding = window_of(handler)
    all_started = threading.Barrier(4)
    for offset in range(4):
        handler.gate(0, offset)
    handler_call = handler.__call__

    def call(record: Record[bytes]) -> None:
        all_started.wait(10)
        handler_call(record)
        handler.gate(0, record.offset).set()

    for offset in range(4):
        handler.gate(0, offset).set()
    object.__setattr__(binding, "handler", call)
    for offset in range(4):
        admit(window, binding, 0, offset, b"k%d" % offset)
    window.wait_ms(0)
    eventually(lambda: window._workers.done.qsize() == 4)
    outcomes = [o for it in window.released() for o in it]
    assert sorted(o.msg.offset for o in outcomes if type(o) is Succeeded) == [0, 1, 2, 3]
    calls = [t for t in threading.enumerate() if t.name.startswith("t:call-")]
    assert calls and all(t.daemon for t in calls)
    window.close()
