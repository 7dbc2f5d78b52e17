"""deploy/grafana/retrytopics.json is what deploy/grafana/dashboard.py generates (regenerate it with
`python deploy/grafana/dashboard.py`), and it has the panels and variables docs/operations.md promises."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("retrytopics_dashboard", GRAFANA / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_json_is_what_the_generator_writes() -> None:
    assert (GRAFANA / "retrytopics.json").read_text() == _generator().render(), (
        "deploy/grafana/retrytopics.json is stale: run `python deploy/grafana/dashboard.py`"
    )


def test_the_dashboard_has_its_panels_and_variables() -> None:
    dashboard = json.loads((GRAFANA / "retrytopics.json").read_text())
    titles = {panel["title"] for panel in dashboard["panels"] if panel["type"] != "row"}
    assert titles == {
        "Source → tiers → DLQ",
        "Retry amplification",
        "Health",
        "Oldest due record, per tier",
        "Lateness p99, per tier",
        "Paused partitions",
        "Lag in seconds",
        "Records waiting",
        "Failures by exception type",
        "DLQ by reason",
    }
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "job", "group", "topic"]
