"""deploy/alerts.yml loads (`promtool check rules`) and every alert fires and stays quiet where its unit tests say
(`promtool test rules deploy/alerts.test.yml`); promtool comes with Debian's prometheus (scripts/setup.sh)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: run scripts/setup.sh (it installs Debian's prometheus)")
    return subprocess.run([promtool, *args], cwd=DEPLOY, capture_output=True, text=True, timeout=60, check=False)


def test_the_rules_load_and_pass_their_unit_tests() -> None:
    checked = _promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", "alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_firing_and_a_quiet_case_and_a_runbook_section() -> None:
    alerts = re.findall(r"^\s+- alert: (\w+)$", (DEPLOY / "alerts.yml").read_text(), re.MULTILINE)
    tests = (DEPLOY / "alerts.test.yml").read_text()
    runbook = (DEPLOY.parent / "docs" / "operations.md").read_text()
    assert len(alerts) == 7
    for alert in alerts:
        cases = re.findall(rf"alertname: {alert}\n\s+exp_alerts:(.*)", tests)
        assert any(case.strip() == "[]" for case in cases), f"{alert} has no quiet case"
        assert any(case.strip() == "" for case in cases), f"{alert} has no firing case"
        assert f"### {alert}" in runbook, f"{alert} has no runbook section in docs/operations.md"
