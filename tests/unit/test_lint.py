"""The code is formatted and linted by one tool, ruff, with the settings in pyproject.toml: a change that
is not formatted, or that trips a kept lint rule, fails the suite rather than a review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_is_clean(command: list[str]) -> None:
    done = subprocess.run([str(RUFF), *command, "."], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout}{done.stderr}"
