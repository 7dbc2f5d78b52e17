"""Live per-stage progress bars for the demo (main, each tier, DLQ) on a terminal; one line per update
when stdout is not a terminal, so logs and CI output stay readable. `StatusLine`: one redrawn line for the
Spark commands (`audit`, `replay`), on a terminal only; job code reports through `step` and `note`."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

__all__ = [
    "JobStatus",
    "ProgressBoard",
    "Stage",
    "StatusLine",
    "finish",
    "note",
    "rate",
    "render_bar",
    "render_status",
    "step",
]


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    done: int
    total: int
    note: str = ""


def render_bar(stage: Stage, width: int = 30, label_width: int = 28) -> str:
    """`main                 [#########.....]  1234/2000  waiting` — pure, for tests and terminals."""
    total = max(stage.total, 1)
    filled = min(width, round(width * min(stage.done, total) / total))
    bar = "#" * filled + "." * (width - filled)
    return f"{stage.name[:label_width]:<{label_width}} [{bar}] {stage.done:>7}/{stage.total:<7} {stage.note}".rstrip()


class ProgressBoard:
    """Redraws the stages in place on a TTY; prints a compact line at most every `interval_s` otherwise."""

    def __init__(self, out: TextIO | None = None, *, interval_s: float = 1.0) -> None:
        self.out = out or sys.stderr
        self.interval_s = interval_s
        self._tty = self.out.isatty()
        self._lines = 0
        self._last = 0.0

    def update(self, stages: Sequence[Stage], *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.1 if self._tty else self.interval_s):
            return
        self._last = now
        if self._tty:
            if self._lines:
                self.out.write(f"\x1b[{self._lines}F")
            for stage in stages:
                self.out.write("\x1b[2K" + render_bar(stage) + "\n")
            self._lines = len(stages)
        else:
            self.out.write(" | ".join(f"{s.name} {s.done}/{s.total}" for s in stages) + "\n")
        self.out.flush()


# --- one status line for long commands (the Spark jobs) -------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What a Spark driver reports about its active jobs (Spark's own stage and task counts)."""

    jobs: int
    stages_done: int
    stages: int
    tasks_done: int
    tasks: int
    tasks_running: int


def render_status(step: str, elapsed_s: float, status: JobStatus | None, width: int = 100) -> str:
    """`audit: counting records | stage 1/2, tasks 3/8 (2 running) | 12s`, cut to `width` — pure."""
    parts = [step]
    if status is not None and status.jobs:
        parts.append(
            f"stage {status.stages_done}/{status.stages}, tasks {status.tasks_done}/{status.tasks}"
            + (f" ({status.tasks_running} running)" if status.tasks_running else "")
        )
    parts.append(f"{elapsed_s:.0f}s")
    line = " | ".join(parts)
    return line if len(line) <= width else line[: max(0, width - 3)] + "..."


class StatusLine:
    """One line on a terminal that says what a long command is doing, redrawn every `interval_s` by a
    background thread from `poll()` (None: nothing to add), plus `note()` lines that stay. Use it only on a
    terminal: the caller decides (`step` and `note` below do nothing while no StatusLine is active)::

        with StatusLine(sys.stderr, poll=lambda: None).active():
            step("reading topics")
            note("read 3 topics: 1,234 records in 2.0s")
    """

    def __init__(
        self,
        out: TextIO,
        poll: Callable[[], JobStatus | None],
        *,
        interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        width: int | None = None,
    ) -> None:
        self.out = out
        self.poll = poll
        self.interval_s = interval_s
        self.clock = clock
        self.width = width or max(20, shutil.get_terminal_size((100, 24)).columns - 1)
        self._start = clock()
        self._step = "starting"
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def step(self, text: str) -> None:
        """What the command does from now on (shown on the redrawn line)."""
        self._step = text
        self.redraw()

    def note(self, text: str) -> None:
        """A line that stays, with the time since the start: `  6.2s  Spark session started`."""
        with self._lock:
            if self._stopped.is_set():
                return
            self.out.write(f"\r\x1b[2K{self.clock() - self._start:6.1f}s  {text}\n")
            self.out.flush()
        self.redraw()

    def redraw(self) -> None:
        try:
            status = self.poll()
        except Exception:  # noqa: BLE001 - a progress line must never fail the command
            status = None
        line = render_status(self._step, self.clock() - self._start, status, self.width)
        with self._lock:
            if not self._stopped.is_set():
                self.out.write(f"\r\x1b[2K{line}")
                self.out.flush()

    @contextmanager
    def active(self) -> Iterator[StatusLine]:
        """Redraw in a daemon thread while the block runs, route `step`/`note` here; clear the line after."""
        thread = threading.Thread(target=self._run, name="retrytopics-progress", daemon=True)
        _active.append(self)
        thread.start()
        try:
            yield self
        finally:
            _active.remove(self)
            self.finish()
            thread.join(timeout=2 * self.interval_s + 1)

    def finish(self) -> None:
        """Clear the line and draw no more (before the command prints its result on the same terminal)."""
        with self._lock:
            if not self._stopped.is_set():
                self._stopped.set()
                self.out.write("\r\x1b[2K")
                self.out.flush()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self.redraw()


_active: list[StatusLine] = []


def step(text: str) -> None:
    """Tell the active status line (if any) what the command does now; nothing when none is active (piped
    output, `--json`, a library call)."""
    for line in _active[-1:]:
        line.step(text)


def note(text: str) -> None:
    """Print a lasting progress line on the active status line (if any); otherwise nothing."""
    for line in _active[-1:]:
        line.note(text)


def finish() -> None:
    """Clear the active status line (if any) for good: call it before printing a result on stdout."""
    for line in _active[-1:]:
        line.finish()


def rate(count: int, seconds: float) -> str:
    """`1,234 records/s`, `0.4 records/s`: a rate for people."""
    per_s = count / max(seconds, 1e-3)
    return f"{per_s:,.0f} records/s" if per_s >= 10 else f"{per_s:.1f} records/s"
