"""The in-flight window's bookkeeping (runtime/concurrency/window.py): two records of one gate are never in flight
together and start in the order they were admitted; the bound counts every record admitted and not settled;
a forgotten partition's waiting records never start and its late returns start nothing."""

from __future__ import annotations

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core.concurrency import OrderMode
from retrytopics.runtime.concurrency.window import Slot, Window, gate_of

TP = ("orders", 0)


def slot(offset: int, key: bytes | None, order: OrderMode = OrderMode.KEY, tp: tuple[str, int] = TP) -> Slot[int]:
    return Slot(tp, gate_of(order, key), 10, offset)


def test_a_key_waits_behind_its_record_in_flight_and_other_keys_start() -> None:
    window: Window[int] = Window(calls=10, max_bytes=1000)
    a0, b1, a2, a3 = slot(0, b"a"), slot(1, b"b"), slot(2, b"a"), slot(3, b"a")
    assert [window.admit(s) for s in (a0, b1, a2, a3)] == [True, True, False, False]
    assert (window.records, window.in_flight, window.bytes) == (4, 2, 40)
    assert window.settle(a0) == (True, [a2])
    assert window.settle(b1) == (True, [])
    assert window.settle(a2) == (True, [a3])
    assert window.settle(a3) == (True, [])
    assert (window.records, window.in_flight, window.bytes) == (0, 0, 0)


def test_a_deferred_record_gives_its_call_back_keeps_its_key_and_goes_first_when_undeferred() -> None:
    window: Window[int] = Window(calls=1, max_bytes=1000)
    a0, a1, b2 = slot(0, b"a"), slot(1, b"a"), slot(2, b"b")
    assert [window.admit(s) for s in (a0, a1, b2)] == [True, False, False]
    assert window.defer(a0) == [b2]  # its call goes to the next record of another key; its key stays behind it
    assert (window.deferred, window.in_flight, window.in_flight_of([TP]), window.records) == (1, 1, 1, 3)
    assert window.busy(TP, b"a") and not window.busy(TP, b"c")
    assert window.undefer() == []  # no free call: it waits first in line
    assert window.settle(b2) == (True, [a0])
    assert window.settle(a0) == (True, [a1])
    assert window.settle(a1) == (True, [])
    assert (window.records, window.in_flight, window.deferred) == (0, 0, 0) and not window.busy(TP, b"a")


def test_a_deferred_record_of_a_revoked_partition_never_starts() -> None:
    window: Window[int] = Window(calls=2, max_bytes=1000)
    a0 = slot(0, b"a")
    assert window.admit(a0)
    window.defer(a0)
    assert window.forget([TP]) == [a0]
    assert (window.records, window.deferred, window.undefer()) == (0, 0, [])


def test_the_order_modes_gate_by_key_partition_or_nothing() -> None:
    assert gate_of(OrderMode.KEY, b"a") == b"a" and gate_of(OrderMode.KEY, None) is None
    assert gate_of(OrderMode.PARTITION, b"a") == gate_of(OrderMode.PARTITION, b"b") is not None
    assert gate_of(OrderMode.NONE, b"a") is None


def test_calls_beyond_the_bound_wait_for_a_free_call_in_admission_order() -> None:
    window: Window[int] = Window(calls=2, max_bytes=1000)
    a, b, c, d = slot(0, b"a"), slot(1, b"b"), slot(2, b"c"), slot(3, b"d")
    assert [window.admit(s) for s in (a, b, c, d)] == [True, True, False, False]
    assert window.in_flight == 2 and window.in_flight_of([TP]) == 2
    assert window.settle(b) == (True, [c])
    assert window.settle(a) == (True, [d])


def test_full_at_twice_the_calls_admitted_or_at_the_byte_bound() -> None:
    window: Window[int] = Window(calls=2, max_bytes=1000)
    for offset in range(3):
        window.admit(slot(offset, b"a"))  # waiting behind its key: counted too
    assert not window.full
    window.admit(slot(3, b"b"))
    assert window.full
    bytes_bound: Window[int] = Window(calls=100, max_bytes=25)
    for offset in range(3):
        bytes_bound.admit(slot(offset, None))
    assert bytes_bound.full and bytes_bound.records == 3


def test_a_forgotten_partition_drops_its_waiting_records_and_its_late_returns_start_nothing() -> None:
    window: Window[int] = Window(calls=10, max_bytes=1000)
    a0, a1, other = slot(0, b"a"), slot(1, b"a"), slot(0, b"a", tp=("orders", 1))
    for s in (a0, a1, other):
        window.admit(s)
    assert window.in_flight_of([TP]) == 1
    assert window.forget([TP]) == [a1]
    assert window.records == 2  # a0 still running, and the other partition's
    # assigned again: a new record of the same key starts, not held behind the abandoned call
    again = slot(1, b"a")
    assert window.admit(again)
    assert window.settle(a0) == (False, [])
    assert window.settle(again) == (True, [])
    assert window.settle(other) == (True, [])
    assert (window.records, window.in_flight, window.bytes) == (0, 0, 0)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.sampled_from([b"a", b"b", b"c", None]), min_size=1, max_size=60),
    order=st.sampled_from(list(OrderMode)),
    calls=st.integers(min_value=1, max_value=8),
    picks=st.lists(st.integers(min_value=0, max_value=1000), max_size=200),
)
def test_never_two_of_one_gate_in_flight_and_each_gate_starts_in_offset_order(
    keys: list[bytes | None], order: OrderMode, calls: int, picks: list[int]
) -> None:
    """Records admitted in offset order, calls returning in any order: at every moment at most `calls` are in
    flight and at most one record of a gate, each gate's records start in offset order, and everything settles
    with counts at 0."""
    window: Window[int] = Window(calls=calls, max_bytes=10**9)
    running: list[Slot[int]] = []
    started: dict[object, list[int]] = {}

    def start(s: Slot[int]) -> None:
        if s.gate is not None:
            assert all(r.gate != s.gate for r in running), f"two of gate {s.gate!r} in flight"
            started.setdefault(s.gate, []).append(s.item)
        running.append(s)
        assert len(running) == window.in_flight <= calls

    for offset, key in enumerate(keys):
        s = slot(offset, key, order)
        if window.admit(s):
            start(s)
    pending = deque(picks)
    while running:
        i = pending.popleft() % len(running) if pending else 0
        done = running.pop(i)
        current, startable = window.settle(done)
        assert current
        for following in startable:
            start(following)
    assert all(offsets == sorted(offsets) for offsets in started.values())
    assert (window.records, window.in_flight, window.bytes) == (0, 0, 0)
    gated = [o for o, k in enumerate(keys) if gate_of(order, k) is not None]
    assert sorted(o for offsets in started.values() for o in offsets) == gated
