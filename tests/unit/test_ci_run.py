""".ci/run, CI's entry point, runs the README's test command and then, with RETRYTOPICS_CI_FAILOVER=1, the slow
failover set, both whatever the other did, and exits non-zero when either failed (pytest's 5, no test collected, counts as a failure); each step is named on
`ci:` lines with its exit status and time. Run on a copy of the script beside a README whose test command and
a `.venv/bin/pytest` stand-in exit as told (no broker, no pytest run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"
SLOW_COMMAND = ".venv/bin/pytest -q -m slow tests/integration/failover"


def _run_ci(
    tmp_path: Path, test_exit: int, slow_exit: int, *, failover: bool = True
) -> subprocess.CompletedProcess[str]:
    (tmp_path / ".ci").mkdir()
    shutil.copy(CI_RUN, tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text(f"# x\n\n**Test:** `echo the-test-command; exit {test_exit}`\n")
    pytest_stand_in = tmp_path / ".venv" / "bin" / "pytest"
    pytest_stand_in.parent.mkdir(parents=True)
    pytest_stand_in.write_text(f'#!/usr/bin/env bash\necho "slow set: $*"\nexit {slow_exit}\n')
    pytest_stand_in.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "RETRYTOPICS_CI_FAILOVER"}
    if failover:
        env["RETRYTOPICS_CI_FAILOVER"] = "1"
    return subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60, check=False, env=env
    )


@pytest.mark.parametrize(
    ("test_exit", "slow_exit", "passed"),
    [(0, 0, True), (1, 0, False), (0, 1, False), (1, 1, False), (5, 0, False), (0, 5, False)],
)
def test_ci_runs_both_steps_and_fails_when_either_fails(
    tmp_path: Path, test_exit: int, slow_exit: int, passed: bool
) -> None:
    done = _run_ci(tmp_path, test_exit, slow_exit)

    assert (done.returncode == 0) is passed, done.stdout + done.stderr
    # both steps ran, the slow one after the README's, whatever the first one's status
    assert done.stdout.index("the-test-command") < done.stdout.index(f"slow set: {SLOW_COMMAND.split(' ', 1)[1]}")
    ci_lines = [line for line in done.stdout.splitlines() if line.startswith("ci: ")]
    assert ci_lines[0] == "ci: test (the README's command): echo the-test-command; exit " + str(test_exit)
    reported = {code: 1 if code == 5 else code for code in (test_exit, slow_exit)}
    assert ci_lines[1].startswith(f"ci: test (the README's command): exit {reported[test_exit]} after ")
    assert ci_lines[2] == f"ci: failover (slow set, 3-node cluster): {SLOW_COMMAND}"
    assert ci_lines[3].startswith(f"ci: failover (slow set, 3-node cluster): exit {reported[slow_exit]} after ")
    assert ci_lines[4].startswith("ci: total time ")
    assert ci_lines[-1] == "ci: passed" or not passed
    assert ("pytest collected no tests" in done.stderr) is (5 in (test_exit, slow_exit))


@pytest.mark.parametrize("test_exit", [0, 1])
def test_without_the_switch_only_the_readme_command_runs_and_decides(tmp_path: Path, test_exit: int) -> None:
    done = _run_ci(tmp_path, test_exit, slow_exit=1, failover=False)

    assert (done.returncode == 0) is (test_exit == 0), done.stdout + done.stderr
    assert "slow set:" not in done.stdout
    assert "ci: failover (slow set, 3-node cluster): not run (RETRYTOPICS_CI_FAILOVER=1 runs it" in done.stdout
