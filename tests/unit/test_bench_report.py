"""The benchmark report's pure parts: percentiles, targets and ratios, the JSON row shape, the markdown.

No broker and no timing: the figures here are made up, only the arithmetic and formatting are under test.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest


def _load_report() -> object:
    # bench/ is a folder of the checkout, not an installed package: load its standard-library-only module by path.
    path = Path(__file__).resolve().parents[2] / "bench" / "report.py"
    spec = importlib.util.spec_from_file_location("bench_report_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


_report = _load_report()
Result, Target = _report.Result, _report.Target  # type: ignore[attr-defined]
format_line, percentile = _report.format_line, _report.percentile  # type: ignore[attr-defined]
render_markdown, write_json = _report.render_markdown, _report.write_json  # type: ignore[attr-defined]


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_ratio_target_and_verdict() -> None:
    row = Result(
        scenario="1.success", n=10, value=45.0, unit="records/s", baseline=50.0, target=Target(">=", 0.9, on="ratio")
    )
    assert row.ratio == pytest.approx(0.9)
    assert row.met is True
    assert Result(scenario="x", n=1, value=101.0, unit="ms", target=Target("<=", 100)).met is False


def test_unmeasured_row_has_no_verdict_and_says_why() -> None:
    row = Result(
        scenario="7.spark.read",
        n=None,
        value=None,
        unit="records/s",
        target=Target(">=", 1),
        note="not yet measurable: no reader",
    )
    assert row.ratio is None and row.met is None
    assert "not measured: not yet measurable" in format_line(row)


def test_json_rows_have_the_issue_fields(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_json(
        [Result(scenario="5.idle", n=3, value=0.25, unit="% of a core", baseline=0.2, target=Target("<=", 1.0))], path
    )
    (row,) = json.loads(path.read_text())
    assert {"scenario", "n", "value", "unit", "baseline", "ratio", "target", "met"} <= set(row)
    assert row["ratio"] == pytest.approx(1.25) and row["met"] is True and row["target"] == "value <= 1"


def test_markdown_has_machine_table_and_guides() -> None:
    info = {"cpu": "Test CPU", "cores": "2", "ram": "1.0 GiB", "os": "Linux", "python": "3.11", "client": "ck"}
    text = render_markdown(
        [Result(scenario="3.lateness.p99", n=10, value=12.0, unit="ms", target=Target("<=", 100))],
        info=info,
        mode="quick",
        broker="tansu",
        wall_s=1.0,
        when=datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert "2026-01-02" in text and "Test CPU (2 cores)" in text
    assert "| 3.lateness.p99 | 10 | 12 | ms | - | - | value <= 100 | met |" in text
    assert "## How to run" in text and "## How to read" in text
