"""Benchmark results: the row model, percentiles, the one-line summary, results.json and docs/benchmarks.md.

Pure apart from `machine()` (reads /proc and the installed client) and the two writers. Every figure comes
from the run that produced it; nothing here holds a number of its own except the targets, which are the
issue's::

    row = Result(scenario="1.success", n=100_000, value=52_000.0, unit="records/s",
                 baseline=60_000.0, target=Target(">=", 0.9, on="ratio"))
    row.ratio, row.met                    # (0.8666..., False)
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

__all__ = ["Result", "Target", "format_line", "machine", "percentile", "render_markdown", "write_json"]


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be in 0..100, not {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Target:
    """A goal from the issue: `value` (or `ratio`) compared with `bound`."""

    op: Literal[">=", "<="]
    bound: float
    on: Literal["value", "ratio"] = "value"

    def met(self, value: float | None, ratio: float | None) -> bool | None:
        subject = ratio if self.on == "ratio" else value
        if subject is None or math.isnan(subject):
            return None
        return subject >= self.bound if self.op == ">=" else subject <= self.bound

    def __str__(self) -> str:
        return f"{'ratio' if self.on == 'ratio' else 'value'} {self.op} {self.bound:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One measured figure. `value` is None when the scenario could not be measured (`note` says why)."""

    scenario: str
    n: int | None
    value: float | None
    unit: str
    baseline: float | None = None
    target: Target | None = None
    note: str = ""
    extra: dict[str, float | int | str | None] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.value, self.ratio)

    def to_json(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "n": self.n,
            "value": _rounded(self.value),
            "unit": self.unit,
            "baseline": _rounded(self.baseline),
            "ratio": _rounded(self.ratio),
            "target": None if self.target is None else str(self.target),
            "met": self.met,
            "note": self.note,
            **(
                {"extra": {k: _rounded(v) if isinstance(v, float) else v for k, v in self.extra.items()}}
                if self.extra
                else {}
            ),
        }


def _rounded(x: float | None) -> float | None:
    if x is None:
        return None
    return float(f"{x:.4g}") if abs(x) < 1000 else round(x, 1)


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _met_word(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "-"}[met]


def format_line(r: Result) -> str:
    """One line for the terminal: scenario, N, figure, baseline, ratio, target and verdict."""
    n = "-" if r.n is None else f"{r.n:,}"
    if r.value is None:
        return f"{r.scenario:<22} n={n:<10} not measured: {r.note}"
    parts = [f"{r.scenario:<22} n={n:<10} {_num(r.value):>10} {r.unit:<12}"]
    parts.append(f"baseline {_num(r.baseline):>10}  ratio {_num(r.ratio):>6}")
    if r.target is not None:
        parts.append(f"target {r.target} -> {_met_word(r.met)}")
    if r.note:
        parts.append(f"({r.note})")
    return "  ".join(parts)


def write_json(results: Iterable[Result], path: Path) -> None:
    path.write_text(json.dumps([r.to_json() for r in results], indent=2) + "\n")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine() -> dict[str, str]:
    """The machine and software the figures were measured on."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    mem_kb = next(
        (int(line.split()[1]) for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal:")), 0
    )
    try:
        import confluent_kafka

        client = f"confluent-kafka {confluent_kafka.__version__}, librdkafka {confluent_kafka.libversion()[0]}"
    except ImportError:
        client = "confluent-kafka not installed"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "ram": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "client": client,
    }


def render_markdown(
    results: Sequence[Result],
    *,
    info: dict[str, str],
    mode: str,
    broker: str,
    wall_s: float,
    findings: str = "",
    when: datetime | None = None,
) -> str:
    """docs/benchmarks.md: machine, results table, how to run, how to read, profiling findings."""
    when = when or datetime.now(UTC)
    rows = [
        "| scenario | N | figure | unit | raw baseline | ratio | target | met |",
        "|---|---:|---:|---|---:|---:|---|---|",
    ]
    for r in results:
        n = "-" if r.n is None else f"{r.n:,}"
        figure = "not measured" if r.value is None else _num(r.value)
        target = "-" if r.target is None else str(r.target)
        rows.append(
            f"| {r.scenario} | {n} | {figure} | {r.unit} | {_num(r.baseline)} | {_num(r.ratio)} "
            f"| {target} | {_met_word(r.met)} |"
        )
    notes = [f"- **{r.scenario}**: {r.note}" for r in results if r.note]
    body = [
        "# Benchmarks",
        "",
        f"Generated by `python -m bench{' --quick' if mode == 'quick' else ''}` on {when:%Y-%m-%d %H:%M} UTC "
        f"({mode} mode, {wall_s:.0f} s wall time). Regenerate rather than edit: the next run overwrites this file.",
        "",
        "## Machine",
        "",
        f"- CPU: {info['cpu']} ({info['cores']} cores)",
        f"- RAM: {info['ram']}",
        f"- OS: {info['os']}; Python {info['python']}; {info['client']}",
        f"- Broker: {broker}",
        "",
        "## Results",
        "",
        *rows,
        "",
        *(["Notes:", "", *notes, ""] if notes else []),
        _HOW_TO,
    ]
    if findings:
        body += ["", "## Profiling findings", "", findings.strip()]
    return "\n".join(body) + "\n"


_HOW_TO = """## How to run

```
python -m bench --quick             # smaller N, a few minutes on a 2-core machine, on Apache Kafka
python -m bench                     # full sizes (1M-record scenarios; several minutes)
python -m bench --only 3.lateness   # one scenario (repeatable: --only 1 --only 4 by number, or a name prefix)
python -m bench --broker tansu      # on the embedded tansu broker instead
python -m bench --only failover     # scenario 10: a leader kill on 3-node clusters of its own (about 3 min)
```

The command starts its own local broker (Apache Kafka 4.4.0 from the Maven cache by default, or tansu with
`--broker tansu`; the Machine section names it), fills every topic itself, runs each measured runtime in a
child process, prints one line per figure and writes `bench/results.json` and this file. Scenario 7 needs
the `spark` extra, and Spark's own Kafka connector in the cache for its `builtin` rows. Scenario 10
(failover) starts 3-node Apache Kafka clusters of its own whatever `--broker` says (docs/operations.md,
"What a failover costs").

## How to read

- **figure** is what the runtime under test achieved; **raw baseline** is the same work done by a
  hand-written confluent-kafka program in the same run, on the same broker, with the same client settings;
  **ratio** = figure / baseline. Baselines are re-measured every run, so ratios are comparable across
  machines while absolute figures are not.
- Throughputs count records from the first record seen to the N-th record done (consumer-group join time
  excluded for both sides). "Done" means handled and offset-tracked (scenario 1) or republished and
  acknowledged by the broker (scenario 2).
- Lateness is `handled_at - retry.due_at` measured inside the handler with the wall clock; every record of
  the scenario falls due within one second, after the tier consumer has paused on them.
- RSS and CPU are read from `/proc/<pid>` of the child process that runs the runtime (sampled every
  100 ms), so the harness's own memory never counts. Idle CPU is (utime + stime) over the idle window,
  as a percentage of one core.
- Growth rows: the baseline is the smallest N's figure scaled linearly (wall time) or unchanged (RSS), so a
  ratio near 1 means linear time and flat memory.
- Floor rows (`9.floor`, bench/floor.py): a hand-written program doing only the least the contract requires
  per record, against the same raw baseline as the target it bounds. A ratio target above its floor's ratio
  cannot be met by any Python runtime on the machine.
- The broker is a single local process (a JVM for Apache Kafka) sharing the 2 cores with the client under
  test; absolute throughputs are therefore lower than on a real cluster, and both sides of each ratio pay
  the same cost.
"""
