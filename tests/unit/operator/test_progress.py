"""Progress output is pure text where it can be, and appears only on a terminal.

- the demo's bars: full at total, empty at zero, never overflowing;
- the Spark commands' status line (`retrytopics audit`, `replay`): on a terminal, the step the job names,
  Spark's stage and task counts and lasting notes; piped or with `--json`, not one extra character."""

from __future__ import annotations

import io
from typing import Any

import pytest

from retrytopics.operator import cli, progress
from retrytopics.operator.progress import JobStatus, ProgressBoard, Stage, StatusLine, render_bar, render_status


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal, and records what was written to it."""

    def isatty(self) -> bool:
        return True


def test_bar_fill_is_proportional_and_bounded() -> None:
    assert "[" + "." * 30 + "]" in render_bar(Stage("main", 0, 100))
    assert "[" + "#" * 15 + "." * 15 + "]" in render_bar(Stage("main", 50, 100))
    assert "[" + "#" * 30 + "]" in render_bar(Stage("dlq", 130, 100, "more than expected"))
    assert render_bar(Stage("tier 1s", 3, 0)).split()[-1] == "3/0"


def test_board_prints_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    board = ProgressBoard(out, interval_s=0)
    board.update([Stage("main", 1, 2), Stage("dlq", 0, 2)], force=True)
    assert out.getvalue() == "main 1/2 | dlq 0/2\n"


def test_status_text_names_the_step_spark_counts_and_time() -> None:
    status = JobStatus(jobs=1, stages_done=1, stages=2, tasks_done=3, tasks=8, tasks_running=2)
    assert render_status("audit: counting", 12.4, status) == "audit: counting | stage 1/2, tasks 3/8 (2 running) | 12s"
    assert render_status("starting", 0.2, None) == "starting | 0s"
    assert render_status("idle", 3, JobStatus(0, 0, 0, 0, 0, 0)) == "idle | 3s"  # no job: no counts
    assert render_status("x" * 200, 1, None, width=40) == "x" * 37 + "..."


def test_status_line_redraws_one_line_and_keeps_notes_on_a_terminal() -> None:
    # setup: a terminal and a Spark driver that runs one job
    out, clock = FakeTerminal(), iter(range(100)).__next__
    status = JobStatus(jobs=1, stages_done=0, stages=1, tasks_done=1, tasks=4, tasks_running=2)
    line = StatusLine(out, poll=lambda: status, interval_s=60, clock=lambda: float(clock()), width=100)

    # when: the job code reports through the module-level hooks
    with line.active():
        progress.step("audit: reading 5 topics")
        progress.note("read 5 topics: 1,234 records in 2.0s (617 records/s)")

    # then: the step is redrawn in place (\r, erase line) with Spark's counts; the note stays on its own line
    text = out.getvalue()
    assert "\r\x1b[2Kaudit: reading 5 topics | stage 0/1, tasks 1/4 (2 running) | 1s" in text
    assert "\r\x1b[2K   2.0s  read 5 topics: 1,234 records in 2.0s (617 records/s)\n" in text
    assert text.endswith("\r\x1b[2K")  # the status line is cleared at the end
    progress.step("after the block")  # no active line: nothing, and no error
    assert out.getvalue() == text


def test_a_finished_line_is_cleared_once_and_draws_nothing_more() -> None:
    out = FakeTerminal()
    with StatusLine(out, poll=lambda: None, interval_s=60).active():
        progress.step("replay: writing")
        progress.finish()  # before the command prints its result
        cleared = out.getvalue()
        progress.step("more")
        progress.note("more")
    assert cleared.endswith("\r\x1b[2K") and out.getvalue() == cleared


def test_rates_read_well_for_small_and_large_counts() -> None:
    assert progress.rate(8, 23.3) == "0.3 records/s"
    assert progress.rate(1_234_567, 2.0) == "617,284 records/s"
    assert progress.rate(5, 0) == "5,000 records/s"


def test_a_failing_status_source_never_fails_the_command() -> None:
    out = FakeTerminal()

    def broken() -> JobStatus:
        raise RuntimeError("py4j: the JVM is gone")

    with StatusLine(out, poll=broken, interval_s=60).active():
        progress.step("replay: writing")
    assert "replay: writing | 0s" in out.getvalue()


def _fake_job(args: Any, **_: Any) -> int:
    """Stands in for the Spark job: reports as the real ones do."""
    progress.step("audit: reading and counting the records of 3 topics")
    progress.note("read 3 topics: 10 records in 0.1s (100 records/s)")
    progress.finish()
    print('{"ok": true}' if args.json else "the table")
    return 0


@pytest.mark.parametrize(
    ("terminal", "flags", "shown"),
    [(True, [], True), (True, ["--json"], False), (True, ["--no-progress"], False), (False, [], False)],
)
def test_the_audit_command_shows_progress_only_on_a_terminal_without_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], terminal: bool, flags: list[str], shown: bool
) -> None:
    # setup: the real CLI with the Spark job replaced; stderr a terminal or not
    import retrytopics.spark.audit as audit_module

    monkeypatch.setattr(audit_module, "run_audit_cli", _fake_job)
    err = FakeTerminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)

    # when
    code = cli.main(["audit", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--group", "g", "--delays", "1s", *flags])

    # then: stdout is the result only; stderr has the progress lines only on a terminal without --json
    assert code == 0
    assert capsys.readouterr().out.strip() in ('{"ok": true}', "the table")
    if shown:
        assert "read 3 topics: 10 records in 0.1s (100 records/s)\n" in err.getvalue()
        assert "audit: reading and counting the records of 3 topics | " in err.getvalue()
        assert err.getvalue().endswith("\r\x1b[2K")
    else:
        assert err.getvalue() == ""
