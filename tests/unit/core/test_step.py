"""The pure per-record decision (retrytopics/core/step.py): the rules in their order, over every combination of facts
(hypothesis): a hop handed off or handled already is never handled again; nothing is handled before it is due;
a record not due waits in memory only within the horizon; and everything else is handled now."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.step import Action, decide

MS = st.integers(0, 10**13)


@given(
    handed_off=st.booleans(),
    duplicate=st.booleans(),
    due=st.none() | MS,
    now=MS,
    horizon=st.integers(0, 10**6),
)
def test_the_rules_hold_in_their_order(
    handed_off: bool, duplicate: bool, due: int | None, now: int, horizon: int
) -> None:
    action = decide(handed_off=handed_off, duplicate=duplicate, due_ms=due, now_ms=now, horizon_ms=horizon)
    not_due = due is not None and due > now
    if handed_off:
        assert action is Action.FINISH_HANDED_OFF
    elif duplicate:
        assert action is Action.SUPPRESS_DUPLICATE
    elif not_due:
        assert action is (Action.WAIT_IN_MEMORY if due - now <= horizon else Action.PAUSE)  # type: ignore[operator]
    else:
        assert action is Action.HANDLE
    # the guarantees, whatever the facts
    if action is Action.HANDLE:
        assert not handed_off and not duplicate and not not_due


def test_examples() -> None:
    facts = {"handed_off": False, "duplicate": False, "now_ms": 1_000, "horizon_ms": 500}
    assert decide(**facts, due_ms=None) is Action.HANDLE  # a source record
    assert decide(**facts, due_ms=1_000) is Action.HANDLE  # due exactly now
    assert decide(**facts, due_ms=1_500) is Action.WAIT_IN_MEMORY
    assert decide(**facts, due_ms=1_501) is Action.PAUSE
    assert decide(**{**facts, "duplicate": True}, due_ms=5_000) is Action.SUPPRESS_DUPLICATE
