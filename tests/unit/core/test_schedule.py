"""The pause schedule wakes partitions at their due time, never early, and never wakes a held or dropped one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.schedule import PauseSchedule

A, B = ("t", 0), ("t", 1)


def test_wait_is_capped_and_never_negative() -> None:
    schedule: PauseSchedule[tuple[str, int]] = PauseSchedule()
    assert schedule.wait_ms(now_ms=0, cap_ms=1000) == 1000  # nothing paused: the cap
    schedule.pause_until(A, due_ms=5_000)
    assert schedule.wait_ms(now_ms=0, cap_ms=1000) == 1000
    assert schedule.wait_ms(now_ms=4_990, cap_ms=1000) == 10
    assert schedule.wait_ms(now_ms=6_000, cap_ms=1000) == 0


def test_pop_due_returns_due_partitions_earliest_first() -> None:
    schedule: PauseSchedule[tuple[str, int]] = PauseSchedule()
    schedule.pause_until(B, due_ms=200)
    schedule.pause_until(A, due_ms=100)
    assert schedule.pop_due(99) == []
    assert schedule.pop_due(250) == [A, B]
    assert schedule.paused == frozenset()


def test_a_new_due_time_replaces_the_old_one() -> None:
    schedule: PauseSchedule[tuple[str, int]] = PauseSchedule()
    schedule.pause_until(A, due_ms=100)
    schedule.pause_until(A, due_ms=300)
    assert schedule.pop_due(200) == []
    assert schedule.next_due_ms() == 300
    assert schedule.pop_due(300) == [A]


def test_dropped_partitions_never_wake() -> None:
    # a revoked partition's timer must not resume it on the next owner's behalf
    schedule: PauseSchedule[tuple[str, int]] = PauseSchedule()
    schedule.pause_until(A, due_ms=100)
    schedule.drop(A)
    assert schedule.pop_due(10_000) == []
    assert schedule.next_due_ms() is None
    assert not schedule.is_paused(A)


def test_held_partition_resumes_only_when_released() -> None:
    schedule: PauseSchedule[tuple[str, int]] = PauseSchedule()
    schedule.hold(A)
    schedule.pause_until(A, due_ms=100)
    assert schedule.pop_due(200) == []  # the timer fired, the hold remains
    assert schedule.is_paused(A)
    assert schedule.release(A) is True
    assert not schedule.is_paused(A)


def test_release_keeps_a_pending_due_time() -> None:
    schedule: PauseSchedule[tuple[str, int]] = PauseSchedule()
    schedule.hold(A)
    schedule.pause_until(A, due_ms=100)
    assert schedule.release(A) is False  # still waiting for its due time
    assert schedule.pop_due(100) == [A]


@given(dues=st.lists(st.integers(0, 10_000), min_size=1, max_size=40), now=st.integers(0, 10_000))
def test_nothing_wakes_before_its_due_time(dues: list[int], now: int) -> None:
    schedule: PauseSchedule[tuple[str, int]] = PauseSchedule()
    for partition, due in enumerate(dues):
        schedule.pause_until(("t", partition), due_ms=due)
    woken = schedule.pop_due(now)
    assert all(dues[p] <= now for _, p in woken)
    assert {p for _, p in woken} == {p for p, due in enumerate(dues) if due <= now}
    assert [dues[p] for _, p in woken] == sorted(dues[p] for _, p in woken)
