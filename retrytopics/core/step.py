"""The pure per-record decision of a consumer loop: what one consumed record is, decided once, from what the
loop knows about it, before any handler runs.

Pure: standard library only, no clock of its own. The records stage (`runtime/records/stage.py`) gathers the
facts (was this hop found downstream at assignment, was it handled here already or is a copy of it waiting,
when is the record due here) and turns the action into an outcome value; a failure's destination is
`router.route`, asked after the handler. The order of the rules is the guarantee:

1. a hop a previous owner handed off already (found downstream at assignment) is finished, not redone;
2. a hop already handled here, or waiting to be (the duplicate check), is suppressed;
3. a record not due yet waits: in memory when due within the horizon, else in Kafka (pause and seek back);
4. anything else is handled now: never before it is due, never twice.

Whatever the action, a record behind others of its partition that wait in memory waits behind them, carrying
its action out in its turn (offset order is kept): the records stage applies that rule.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Action", "decide"]


class Action(StrEnum):
    FINISH_HANDED_OFF = "finish_handed_off"
    SUPPRESS_DUPLICATE = "suppress_duplicate"
    WAIT_IN_MEMORY = "wait_in_memory"
    PAUSE = "pause"
    HANDLE = "handle"


def decide(*, handed_off: bool, duplicate: bool, due_ms: int | None, now_ms: int, horizon_ms: int) -> Action:
    """The action for one record (see the module docstring). `due_ms` is when it is due here (None: a
    source record, or a tier record due already); `horizon_ms` how far ahead a record may wait in memory."""
    if handed_off:
        return Action.FINISH_HANDED_OFF
    if duplicate:
        return Action.SUPPRESS_DUPLICATE
    if due_ms is not None and due_ms > now_ms:
        return Action.WAIT_IN_MEMORY if due_ms - now_ms <= horizon_ms else Action.PAUSE
    return Action.HANDLE
