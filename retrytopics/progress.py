"""Live per-stage progress bars for the demo (main, each tier, DLQ) on a terminal; one line per update
when stdout is not a terminal, so logs and CI output stay readable."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

__all__ = ["Stage", "ProgressBoard", "render_bar"]


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
