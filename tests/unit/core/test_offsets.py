"""Commit positions move only over a gap-free prefix of finished records, and stale acknowledgements
(from before a revocation) never move them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.offsets import OffsetTracker

TP = ("orders", 0)


def test_position_waits_for_the_oldest_unfinished_record() -> None:
    # setup
    tracker = OffsetTracker()
    epoch = tracker.assign(TP)
    for offset in (10, 11, 12):
        tracker.track(TP, offset)
    # when: a later record finishes first
    tracker.finish(TP, 11, epoch)
    tracker.finish(TP, 12, epoch)
    # then: nothing is committable until 10 finishes, then everything is
    assert tracker.commit_positions() == {}
    tracker.finish(TP, 10, epoch)
    assert tracker.commit_positions() == {TP: 13}


def test_committed_positions_are_not_offered_again() -> None:
    tracker = OffsetTracker()
    epoch = tracker.assign(TP)
    tracker.track(TP, 0)
    tracker.finish(TP, 0, epoch)
    tracker.mark_committed(tracker.commit_positions())
    assert tracker.commit_positions() == {}
    assert tracker.positions() == {TP: 1}


def test_gaps_in_offsets_are_fine() -> None:
    # transaction markers and compaction leave holes in a partition's offsets
    tracker = OffsetTracker()
    epoch = tracker.assign(TP)
    tracker.track(TP, 3)
    tracker.track(TP, 7)
    tracker.finish(TP, 3, epoch)
    tracker.finish(TP, 7, epoch)
    assert tracker.commit_positions() == {TP: 8}


def test_an_ack_from_a_previous_assignment_is_ignored() -> None:
    # setup: offset 5 is republished, then the partition is revoked and assigned again
    tracker = OffsetTracker()
    old = tracker.assign(TP)
    tracker.track(TP, 5)
    tracker.revoke(TP)
    new = tracker.assign(TP)
    tracker.track(TP, 5)
    # when: the old republish is acknowledged
    assert tracker.finish(TP, 5, old) is False
    # then: only the new owner's decision counts
    assert tracker.commit_positions() == {}
    assert tracker.finish(TP, 5, new) is True
    assert tracker.commit_positions() == {TP: 6}


def test_revoked_partition_has_no_position() -> None:
    tracker = OffsetTracker()
    epoch = tracker.assign(TP)
    tracker.track(TP, 0)
    tracker.finish(TP, 0, epoch)
    tracker.revoke(TP)
    assert tracker.positions() == {}
    assert tracker.finish(TP, 0, epoch) is False


def test_rewind_returns_the_last_commit_or_the_first_tracked_offset() -> None:
    tracker = OffsetTracker()
    epoch = tracker.assign(TP)
    tracker.track(TP, 4)
    tracker.finish(TP, 4, epoch)
    tracker.track(TP, 5)
    assert tracker.rewind(TP) == 4  # never committed: back to the first tracked offset
    tracker.track(TP, 4)
    tracker.finish(TP, 4, epoch)
    tracker.mark_committed(tracker.commit_positions())
    tracker.track(TP, 5)
    tracker.finish(TP, 5, epoch)
    assert tracker.rewind(TP) == 5  # the committed position
    assert tracker.commit_positions() == {}


def test_offsets_must_increase() -> None:
    tracker = OffsetTracker()
    tracker.track(TP, 3)
    try:
        tracker.track(TP, 3)
    except ValueError as exc:
        assert "must increase" in str(exc)
    else:
        raise AssertionError("a repeated offset was accepted")


@given(order=st.permutations(list(range(30))), finished=st.sets(st.integers(0, 29)))
def test_position_is_one_past_the_longest_finished_prefix(order: list[int], finished: set[int]) -> None:
    tracker = OffsetTracker()
    epoch = tracker.assign(TP)
    for offset in range(30):
        tracker.track(TP, offset)
    for offset in order:
        if offset in finished:
            tracker.finish(TP, offset, epoch)
    prefix = 0
    while prefix in finished:
        prefix += 1
    expected = {TP: prefix} if prefix else {}
    assert tracker.commit_positions() == expected
    assert tracker.in_flight(TP) == 30 - prefix


@given(
    at_once=st.lists(st.booleans(), min_size=1, max_size=40),
    finish_order=st.randoms(use_true_random=False),
)
def test_finishing_at_once_moves_positions_exactly_as_track_then_finish(at_once: list[bool], finish_order) -> None:
    # setup: the same records through both paths; a record not finished at once is handed off and finishes later
    fast, slow = OffsetTracker(), OffsetTracker()
    fast_epoch, slow_epoch = fast.assign(TP), slow.assign(TP)
    later: list[int] = []
    for offset, succeeded in enumerate(at_once, start=100):
        # when
        if succeeded:
            assert fast.finish_at_once(TP, offset) is True
            slow.finish(TP, offset, slow.track(TP, offset))
        else:
            fast.track(TP, offset)
            slow.track(TP, offset)
            later.append(offset)
        # then: the positions agree after every step
        assert fast.commit_positions() == slow.commit_positions()
        assert fast.in_flight(TP) == slow.in_flight(TP)
    finish_order.shuffle(later)
    for offset in later:
        assert fast.finish(TP, offset, fast_epoch) == slow.finish(TP, offset, slow_epoch)
        assert fast.commit_positions() == slow.commit_positions()
    assert fast.commit_positions() == {TP: 100 + len(at_once)}
    assert fast.rewind(TP) == slow.rewind(TP) == 100


def test_finishing_at_once_before_the_position_is_refused() -> None:
    tracker = OffsetTracker()
    tracker.finish_at_once(TP, 5)
    try:
        tracker.finish_at_once(TP, 3)
    except ValueError as exc:
        assert "before the finished position" in str(exc)
    else:
        raise AssertionError("an offset behind the position was accepted")


@given(runs=st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=12))
def test_finishing_a_run_equals_finishing_each_at_once(runs: list[tuple[int, bool]]) -> None:
    # setup: runs of successes (a batch call), each optionally followed by a hand-off still in flight
    bulk, each = OffsetTracker(), OffsetTracker()
    epoch_bulk, epoch_each = bulk.assign(TP), each.assign(TP)
    offset, pending = 0, []
    for size, then_pending in runs:
        run = list(range(offset, offset + size))
        # when
        assert bulk.finish_run(TP, run) == sum(each.finish_at_once(TP, o) for o in run) == size
        offset += size
        if then_pending:
            bulk.track(TP, offset)
            each.track(TP, offset)
            pending.append(offset)
            offset += 1
        # then
        assert bulk.commit_positions() == each.commit_positions()
    # and: the hand-offs acknowledged in any order (here the last first) move both alike
    for o in reversed(pending):
        assert bulk.finish(TP, o, epoch_bulk) == each.finish(TP, o, epoch_each) is True
        assert bulk.positions() == each.positions() and bulk.in_flight(TP) == each.in_flight(TP)
    assert bulk.commit_positions() == each.commit_positions() == {TP: offset}


@given(
    runs=st.lists(
        st.tuples(st.integers(1, 5), st.integers(0, 3), st.sampled_from(["none", "pending", "acked"])),
        min_size=1,
        max_size=12,
    ),
    unassigned=st.booleans(),
)
def test_a_span_settled_by_its_ends_equals_finishing_the_run(
    runs: list[tuple[int, int, str]], unassigned: bool
) -> None:
    """A batch call's run settled by its first and last offsets (`finish_span`, where it says it can) moves
    positions, first offsets and what is in flight exactly as `finish_run` with every offset; where it says it
    cannot (something in flight before it, an unassigned partition), it changes nothing."""
    span, run_tracker = OffsetTracker(), OffsetTracker()
    if not unassigned:
        span.assign(TP)
        run_tracker.assign(TP)
    epochs: dict[int, int] = {}
    offset = 0
    for size, gap, after in runs:
        offset += gap  # offsets of a run may skip (compaction, transaction markers)
        run = list(range(offset, offset + 2 * size, 2))
        before = (span.positions(), span.in_flight(TP))
        if span.finish_span(TP, run[0], run[-1]):
            run_tracker.finish_run(TP, run)
        else:
            assert (span.positions(), span.in_flight(TP)) == before
            assert span.finish_run(TP, run) == run_tracker.finish_run(TP, run) == len(run)
        offset = run[-1] + 1
        if after != "none":  # a hand-off after the run, acknowledged at once or left in flight
            epochs[offset] = span.track(TP, offset)
            run_tracker.track(TP, offset)
            if after == "acked":
                assert span.finish(TP, offset, epochs[offset]) == run_tracker.finish(TP, offset, epochs[offset])
            offset += 1
        assert span.positions() == run_tracker.positions()
        assert span.in_flight(TP) == run_tracker.in_flight(TP)
    assert span.commit_positions() == run_tracker.commit_positions()
    assert span.rewind(TP) == run_tracker.rewind(TP)  # the first offset tracked (nothing committed): the same


# -- a partition's tail past its last record (markers, aborted records): `read`, `settled`, `skip_to` ------------


def test_a_settled_partition_moves_to_the_consumer_position() -> None:
    # setup: records 10..12 read and finished; a commit marker and an aborted record follow at 13 and 14
    t = OffsetTracker()
    epoch = t.assign(TP)
    for offset in (10, 11, 12):
        t.finish(TP, offset, t.track(TP, offset))
    t.read(TP, 13)
    # when / then: settled, the position moves past what was never delivered
    assert t.settled() == [TP]
    assert t.skip_to(TP, 15)
    assert t.commit_positions() == {TP: 15}
    # and a later record goes on from there
    t.finish(TP, 16, t.track(TP, 16))
    assert t.commit_positions() == {TP: 17} and t.epoch(TP) == epoch


def test_never_past_a_record_in_flight() -> None:
    t = OffsetTracker()
    t.assign(TP)
    t.finish_at_once(TP, 0)
    t.track(TP, 1)  # handed off, unacknowledged
    t.read(TP, 2)
    assert t.settled() == []
    assert not t.skip_to(TP, 4)
    assert t.commit_positions() == {TP: 1}


def test_never_past_a_record_read_but_not_yet_tracked() -> None:
    # a record delivered and waiting in memory (or parked, or running) is not in the tracker yet
    t = OffsetTracker()
    t.assign(TP)
    t.finish_at_once(TP, 0)
    t.read(TP, 3)  # records 1 and 2 were delivered too
    assert t.settled() == []
    assert not t.skip_to(TP, 5)
    assert t.commit_positions() == {TP: 1}


def test_read_but_not_finished_is_not_settled() -> None:
    t = OffsetTracker()
    t.assign(TP)
    t.read(TP, 1)
    assert t.settled() == [] and not t.skip_to(TP, 3)
    t.track(TP, 0)
    assert t.settled() == [] and not t.skip_to(TP, 3)
    assert not t.skip_to(("other", 0), 3)  # not assigned


def test_nothing_read_since_the_assignment_moves_to_the_position() -> None:
    # a new owner starts at the committed offset, and its fetch skipped only markers and aborted records
    t = OffsetTracker()
    t.assign(TP)
    assert t.settled() == [TP]
    assert not t.skip_to(TP, 0)  # an empty partition: nothing skipped, nothing to commit
    assert t.skip_to(TP, 139)
    assert t.commit_positions() == {TP: 139}
    t.mark_committed({TP: 139})
    assert not t.skip_to(TP, 139) and t.commit_positions() == {}


def test_a_position_behind_is_a_seek_back_and_ignored() -> None:
    t = OffsetTracker()
    t.assign(TP)
    t.finish_at_once(TP, 4)
    t.read(TP, 5)
    assert not t.skip_to(TP, 5) and not t.skip_to(TP, 2)
    assert t.commit_positions() == {TP: 5}


def test_a_rewind_unsettles_until_the_records_are_finished_again() -> None:
    t = OffsetTracker()
    t.assign(TP)
    t.finish(TP, 0, t.track(TP, 0))
    t.mark_committed(t.commit_positions())
    t.finish(TP, 1, t.track(TP, 1))
    t.read(TP, 2)
    t.rewind(TP)  # the transaction that finished offset 1 aborted
    assert t.settled() == [] and not t.skip_to(TP, 4)
    t.finish(TP, 1, t.track(TP, 1))
    assert t.skip_to(TP, 4) and t.commit_positions() == {TP: 4}


def test_a_new_assignment_forgets_what_was_read() -> None:
    t = OffsetTracker()
    t.assign(TP)
    t.finish_at_once(TP, 0)
    t.track(TP, 1)
    t.read(TP, 2)
    assert t.settled() == []
    t.assign(TP)  # a new epoch: what the old one read and left in flight is its new owner's
    assert t.settled() == [TP] and t.commit_positions() == {}
