"""Run a measured program in a child process and sample its RSS and CPU from /proc.

The child speaks a one-line protocol on stdout: ``@bench {"event": "...", ...}``. The parent timestamps each
event and keeps a /proc sample next to it, so that a scenario can ask "how much CPU between *paused* and
now" or "what was the peak RSS after *ready*" without the harness's own memory ever counting::

    with Child("bench.child", "tier_wait", {"topic": "t"}) as child:
        child.wait_for("paused", timeout_s=60)
        idle = child.cpu_since("paused")        # CPU seconds of the child since that event
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.profile import attach

__all__ = ["Child", "ChildFailed", "Sample", "emit", "read_sample"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_PREFIX = "@bench "


class ChildFailed(RuntimeError):
    """The child exited early, timed out, or reported an error."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of a process: monotonic time, resident set size (bytes), CPU seconds (user + system)."""

    at: float
    rss: int
    cpu_s: float


def read_sample(pid: int) -> Sample | None:
    """RSS from /proc/<pid>/statm, CPU from /proc/<pid>/stat; None once the process is gone."""
    try:
        statm = Path(f"/proc/{pid}/statm").read_text().split()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces; the fields after its closing parenthesis do not.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return Sample(at=time.monotonic(), rss=int(statm[1]) * _PAGE, cpu_s=(utime + stime) / _CLK_TCK)


def emit(event: str, **data: Any) -> None:
    """Child side: report an event to the parent (flushed at once)."""
    sys.stdout.write(_PREFIX + json.dumps({"event": event, **data}) + "\n")
    sys.stdout.flush()


@dataclass(slots=True)
class _Event:
    data: dict[str, Any]
    at: float
    sample: Sample | None


@dataclass
class _State:
    events: dict[str, _Event] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)


class Child:
    """A child Python process (`python -m <module> <role> <json args>`) sampled every `interval_s`."""

    def __init__(
        self,
        module: str,
        role: str,
        args: Mapping[str, Any],
        *,
        interval_s: float = 0.1,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._argv = [sys.executable, "-m", module, role, json.dumps(dict(args))]
        self._role = role
        self._profiler: subprocess.Popen[bytes] | None = None
        self._interval_s = interval_s
        self._env = {**os.environ, **(env or {})}
        self._state = _State()
        self._proc: subprocess.Popen[str] | None = None
        self._done = threading.Event()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def __enter__(self) -> Child:
        self._proc = subprocess.Popen(
            self._argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self._env,
            cwd=Path(__file__).resolve().parent.parent,
        )
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()
        self._profiler = attach(self._proc.pid, self._role)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(_PREFIX):
                data = json.loads(line[len(_PREFIX) :])
                event = _Event(data=data, at=time.monotonic(), sample=read_sample(self.pid))
                with self._state.cond:
                    self._state.events[data["event"]] = event
                    self._state.cond.notify_all()
            else:
                self._state.output.append(line.rstrip("\n"))
                del self._state.output[:-200]
        with self._state.cond:
            self._done.set()
            self._state.cond.notify_all()

    def _sample(self) -> None:
        while not self._done.is_set():
            sample = read_sample(self.pid)
            if sample is None:
                return
            self._state.samples.append(sample)
            self._done.wait(self._interval_s)

    def wait_for(self, event: str, timeout_s: float) -> dict[str, Any]:
        """Block until the child reports `event`; raises `ChildFailed` on exit, error or timeout."""
        deadline = time.monotonic() + timeout_s
        with self._state.cond:
            while event not in self._state.events:
                if "error" in self._state.events:
                    raise ChildFailed(f"child reported: {self._state.events['error'].data}\n{self.tail()}")
                if self._done.is_set():
                    raise ChildFailed(f"child exited before {event!r}\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChildFailed(f"no {event!r} from the child within {timeout_s}s\n{self.tail()}")
                self._state.cond.wait(min(left, 0.5))
            return self._state.events[event].data

    def event_time(self, event: str) -> float:
        return self._state.events[event].at

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self._state.output[-lines:])

    def samples_since(self, event: str | None = None) -> list[Sample]:
        start = self._state.events[event].at if event else 0.0
        return [s for s in list(self._state.samples) if s.at >= start]

    def peak_rss(self, since: str | None = None) -> int:
        return max((s.rss for s in self.samples_since(since)), default=0)

    def cpu_since(self, event: str) -> tuple[float, float]:
        """(CPU seconds, wall seconds) of the child from `event` until now."""
        start = self._state.events[event].sample
        now = read_sample(self.pid)
        if start is None or now is None:
            raise ChildFailed(f"the child is gone; cannot read its CPU since {event!r}")
        return now.cpu_s - start.cpu_s, now.at - start.at

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Terminate (SIGTERM, then SIGKILL) and reap the child; returns its exit status."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._done.wait(2.0)
        if self._profiler is not None:
            self._profiler.wait(timeout=30)  # py-spy writes its file when the child exits
        return proc.returncode

    def join(self, timeout_s: float) -> int:
        """Wait for the child to exit on its own."""
        assert self._proc is not None
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ChildFailed(f"child still running after {timeout_s}s\n{self.tail()}") from None
