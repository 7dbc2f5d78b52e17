"""The failover drill's pure parts (bench/drill.py, loaded by path): the stall is the longest time after the
fault, while records were still produced, in which no source record was handled; the fates give every id
one planned outcome in the proportions the drill's docstring states."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType


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
