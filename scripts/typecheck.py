"""`mypy --strict` over the package as it installs (`python scripts/typecheck.py`).

The repository keeps the design card's top-level folders (connectors/, spark/, schemas/), which the wheel
installs as `retrytopics.connectors`, `retrytopics.spark` and `retrytopics.schemas` (pyproject.toml's
package-dir). Run over the folders as they are, mypy cannot find those modules (59 import errors, and
everything behind them unchecked). This script builds that layout out of symbolic links in a temporary
folder, checks the `retrytopics` package there with the settings of pyproject.toml, and exits with mypy's
status. The test suite runs it (tests/unit/test_typing.py), so CI checks the types on every run.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: installed name -> folder in the repository, as in pyproject.toml's package-dir
MAPPED = {"connectors": ROOT / "connectors", "spark": ROOT / "spark", "schemas": ROOT / "schemas"}


def installed_layout(into: Path) -> Path:
    """`into`/retrytopics with the package's files and the mapped folders linked in; returns that folder."""
    package = into / "retrytopics"
    package.mkdir()
    for item in (ROOT / "retrytopics").iterdir():
        if item.name != "__pycache__":
            (package / item.name).symlink_to(item)
    for name, folder in MAPPED.items():
        (package / name).symlink_to(folder)
    return package


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="retrytopics-typecheck-") as tmp:
        installed_layout(Path(tmp))
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--python-executable",
            sys.executable,
            "--cache-dir",
            str(Path(tmp) / ".mypy_cache"),
            "-p",
            "retrytopics",
        ]
        return subprocess.run(command, cwd=tmp, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
