"""The package type-checks under `mypy --strict` as it installs: `scripts/typecheck.py` links the
repository's folders into the installed layout, where `retrytopics.connectors` and `retrytopics.spark`
resolve, and runs mypy with pyproject.toml's settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_passes_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout
