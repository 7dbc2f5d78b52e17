"""What a benchmark run selects and what its children report (bench/, a folder of the checkout: imported with the
checkout on the path). No broker: the child's accounting is driven by hand."""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(module: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))
    return importlib.import_module(module)


@pytest.mark.parametrize(
    ("only", "expected"),
    [
        (["1"], ["1.success"]),
        (["10"], ["10.failover"]),
        (["1", "2", "9"], ["1.success", "2.failure", "9.floor"]),
        (["8"], ["8.console", "8.peer"]),
        (["3.lateness"], ["3.lateness"]),
        (["failure"], ["2.failure"]),
        (["fail"], ["2.failure", "10.failover"]),
    ],
)
def test_only_selects_by_whole_number_full_name_or_name(
    only: list[str], expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--only 1` runs scenario 1 and not 10.failover (a bare number is the whole number); names and full names
    still select by prefix."""
    main = _bench("bench.__main__", monkeypatch)
    assert [m.NAME for m in main._selected(only)] == expected


def test_unknown_scenario_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A selection that matches nothing stops the run and lists the scenarios."""
    main = _bench("bench.__main__", monkeypatch)
    with pytest.raises(SystemExit, match=r"2\.failure"):
        main._selected(["99"])


def test_a_batch_counted_at_once_finishes_at_the_call_that_reaches_n(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch handler counts its records per call (`tick(len(records))`), as the floor counts them: the call
    that reaches n (passing it, too) finishes the run and stamps its end once; a later call stamps nothing."""
    runtime = _bench("bench.runtime", monkeypatch)
    finish = runtime._Finish(5)
    finish.tick(3)
    assert not finish.done.is_set() and finish.first and not finish.last
    finish.tick(3)
    assert finish.done.is_set() and finish.count == 6
    last = finish.last
    finish.tick(2)
    assert finish.last == last and finish.count == 8


def test_child_reports_its_cpu_time_per_record(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runtime child's report carries the CPU time its process spent between the first and the n-th record,
    per record: on a shared machine records/s moves with the load, CPU time far less (bench/findings.md, mypyc)."""
    runtime = _bench("bench.runtime", monkeypatch)
    measure = _bench("bench.measure", monkeypatch)
    finish = runtime._Finish(2)
    finish.tick()
    burn_until = time.process_time() + 0.05  # 50 ms of this process's CPU between the first and the last record
    while time.process_time() < burn_until:
        pass
    finish.tick()
    assert finish.done.is_set()
    finish.report()
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith(measure._PREFIX)]
    report = json.loads(line[len(measure._PREFIX) :])
    assert report["event"] == "done" and report["count"] == 2
    assert report["cpu_us_per_record"] >= 25_000  # 50 ms over 2 records
