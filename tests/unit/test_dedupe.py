"""The duplicate audit recognises a repeated hop, stays bounded, and forgets rolled-back keys."""

from __future__ import annotations

import pytest

from retrytopics.dedupe import DuplicateAudit


def test_second_sighting_is_a_duplicate() -> None:
    audit = DuplicateAudit(capacity=10)
    assert audit.check_and_remember(("orders-0-1", 0, 1)) is False
    assert audit.check_and_remember(("orders-0-1", 0, 1)) is True


def test_other_attempts_and_replays_are_not_duplicates() -> None:
    audit = DuplicateAudit(capacity=10)
    audit.remember(("orders-0-1", 0, 1))
    assert ("orders-0-1", 0, 2) not in audit  # the next hop of the same record
    assert ("orders-0-1", 1, 1) not in audit  # the same hop after a replay from the DLQ


def test_capacity_bounds_memory_and_evicts_least_recently_seen() -> None:
    audit = DuplicateAudit(capacity=2)
    audit.remember(("a", 0, 1))
    audit.remember(("b", 0, 1))
    audit.check_and_remember(("a", 0, 1))  # refreshes "a"
    audit.remember(("c", 0, 1))
    assert len(audit) == 2
    assert ("b", 0, 1) not in audit
    assert ("a", 0, 1) in audit and ("c", 0, 1) in audit


def test_forget_undoes_a_rolled_back_handling() -> None:
    audit = DuplicateAudit(capacity=2)
    audit.remember(("a", 0, 1))
    audit.forget(("a", 0, 1))
    assert ("a", 0, 1) not in audit


@pytest.mark.parametrize("capacity", [0, -1, True, 1.5])
def test_capacity_must_be_a_positive_int(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        DuplicateAudit(capacity=capacity)  # type: ignore[arg-type]
