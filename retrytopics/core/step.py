"""The pure per-record step of a consumer loop: what to do with one consumed record, decided from what the
loop knows about it and its partition, before any handler runs.

Pure: standard library only, no clock of its own. The loop (`runtime/loop.py`) gathers the facts (is the
partition's queue in memory non-empty, was this hop found downstream at assignment, was it handled here
already, when is the record due here) and carries out the action; a failure's destination is `router.route`,
which the loop calls after the handler. The order of the rules is the guarantee:

1. a record behind others of its partition that wait in memory waits behind them (offset order is kept);
2. a hop a previous owner handed off already (found downstream at assignment) is finished, not redone;
3. a hop already handled here (the duplicate check) is suppressed;
4. a record not due yet waits: in memory when due within the horizon, else in Kafka (pause and seek back);
5. anything else is handled now: never before it is due, never twice.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Action", "decide"]


class Action(StrEnum):
    WAIT_BEHIND = "wait_behind"
    FINISH_HANDED_OFF = "finish_handed_off"
    SUPPRESS_DUPLICATE = "suppress_duplicate"
    WAIT_IN_MEMORY = "wait_in_memory"
    PAUSE = "pause"
    HANDLE = "handle"


def decide(
    *, behind_queue: bool, handed_off: bool, duplicate: bool, due_ms: int | None, now_ms: int, horizon_ms: int
) -> Action:
    """The action for one record (see the module docstring). `due_ms` is when it is due here (None: a
    source record, or a tier record due already); `horizon_ms` how far ahead a record may wait in memory."""
    if behind_queue:
        return Action.WAIT_BEHIND
    if handed_off:
        return Action.FINISH_HANDED_OFF
    if duplicate:
        return Action.SUPPRESS_DUPLICATE
    if due_ms is not None and due_ms > now_ms:
        return Action.WAIT_IN_MEMORY if due_ms - now_ms <= horizon_ms else Action.PAUSE
    return Action.HANDLE
