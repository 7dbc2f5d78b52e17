"""The failover drill's pure parts (bench/drill.py, loaded by path): the stall is the longest time after the
fault, while records were still produced, in which no source record was handled; the fates give every id
one planned outcome in the proportions the drill's docstring states; an app stopped on a transaction of
unknown outcome is started again as an operator does."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


def _drill() -> ModuleType:
    name = "retrytopics_failover_drill"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "bench" / "drill.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_the_stall_counts_only_gaps_after_the_fault_while_records_were_produced() -> None:
    stall = _drill()._stall_s
    handled = [0, 100, 5_000, 5_100, 14_100, 14_200, 30_000]
    # fault at 1,000 ms: 100 -> 5,000 counts from the fault (4 s), 5,100 -> 14,100 is 9 s, 14,200 -> 30,000
    # is 15.8 s and counts only if it began while records were still produced (they waited through it)
    assert stall(handled, 1_000, 20_000) == 15.8
    assert stall(handled, 1_000, 14_000) == 9.0
    assert stall(handled, 1_000, 4_000) == 4.0
    assert stall(handled, 20_000, 40_000) == 10.0  # gaps before the fault never count
    assert stall([], 1_000, 20_000) == 0.0


def test_every_id_has_one_planned_fate_in_the_stated_proportions() -> None:
    drill = _drill()
    fates = Counter(drill.fate(i) for i in range(2000))
    assert fates == {"succeed": 1600, "fail_once": 200, "non_retryable": 100, "always_fail": 100}


class _StandInApp:
    """What `_Operated` uses of a RetryApp: built with its arguments, started, stopped, its error."""

    def __init__(self, **arguments: object) -> None:
        self.arguments = arguments
        self.instance_id = arguments["instance_id"] or "first-random-id"
        self.error: BaseException | None = None
        self.started = self.stopped = False
        self.handlers: list[object] = []

    def handler(self, topic: str, **_: object) -> Callable[[object], object]:
        return lambda fn: self.handlers.append((topic, fn))

    def start(self, **_: object) -> None:
        self.started = True

    def stop(self, timeout: float) -> bool:
        self.stopped = True
        return True


def test_an_app_stopped_on_a_transaction_of_unknown_outcome_is_started_again_under_its_instance_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retrytopics.runtime.handoff.transactional import TransactionOutcomeUnknown

    drill = _drill()
    monkeypatch.setattr(drill, "RetryApp", _StandInApp)
    ledger = drill._Ledger()
    operated = drill._Operated(object(), "group-1", "orders", drill.DrillPlan(exactly_once=True), ledger)
    first = operated.current
    assert operated.restart_if_outcome_unknown() is False  # running, no error: nothing to do

    # when: the app stopped on a commit of unknown outcome
    first.error = TransactionOutcomeUnknown("commit_transaction: abandoned", code="_TIMED_OUT")

    # then: a new app, same group, same instance id (fencing the old producer), the same handler, started
    assert operated.restart_if_outcome_unknown() is True
    second = operated.current
    assert first.stopped and second is not first and second.started and operated.restarts == 1
    assert second.arguments["group"] == "group-1" and second.arguments["exactly_once"] is True
    assert second.instance_id == first.instance_id == "first-random-id"
    assert second.handlers == [("orders", ledger.handle)]

    # any other error ends the drill with it; and restarts are bounded
    second.error = RuntimeError("a bug")
    assert operated.restart_if_outcome_unknown() is False and operated.current is second
    for _ in range(drill._Operated.MAX_RESTARTS):
        operated.current.error = TransactionOutcomeUnknown("again", code="_TIMED_OUT")
        operated.restart_if_outcome_unknown()
    assert operated.restarts == drill._Operated.MAX_RESTARTS
    assert operated.restart_if_outcome_unknown() is False
