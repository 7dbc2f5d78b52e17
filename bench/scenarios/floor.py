"""9. Floors: how close to a ratio target Python can come at all. The floor roles (bench/floor.py) do by hand,
with nothing else, the least any program must do per record to keep retrytopics' contract; each is set
against the raw baseline its target is measured against, in the same run, on the same topics:

- `9.floor.batch`: one immutable record per consumed record, one handler call per poll and partition, vs the
  raw consume loop (`1.success.batch`'s baseline; its target is 0.8x);
- `9.floor.failure`: the handler raises, the failure is described, the record is republished with the 16
  retry headers, positions are committed behind the acknowledgements, vs the raw producer sending the very
  bytes of a retry record (`2.failure`'s baseline; its target is 0.5x).

A target above its floor's ratio cannot be met by any runtime on this machine, however lean.

The runtime against its floor, run by run: `9.runtime.batch` (a no-op batch handler, `1.success.batch`'s app)
and `9.runtime.failure` (a handler that always fails, `2.failure`'s app) each run right after their floor, on
the same pre-filled topic, three times in both modes; the figure is the median of the three ratios runtime /
floor. Pairing the runs keeps a slower minute of the shared cores (the broker runs beside them) out of the
ratio, which comparing two scenarios run minutes apart did not.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.context import Bench
from bench.load import create_topics, fill
from bench.report import Result, Target
from bench.scenarios.failure import _first_headers

NAME = "9.floor"
BATCH = 500
PAIRS = 3
BATCH_TARGET = 0.9  # the batch handler against its floor
FAILURE_TARGET = 0.6  # the failure path against its floor


def run(b: Bench) -> list[Result]:
    n, n_fail = b.size(100_000, 1_000_000), b.size(30_000, 300_000)
    source = b.name("floor")
    create_topics(b.kafka, [source], b.partitions)
    fill(b.kafka, source, n, partitions=b.partitions)
    consume = {"topic": source, "n": n, "batch": BATCH, "commit_every": BATCH, "commit_interval_s": 1.0}
    raw, floor, app_batch = [], [], []
    failing, tier, produced = b.name("floor-fail"), b.name("floor-tier"), b.name("floor-produce")
    create_topics(b.kafka, [failing, tier, produced], b.partitions)
    fill(b.kafka, failing, n_fail, partitions=b.partitions)
    failed, app_failed = [], []
    for pair in range(PAIRS):  # alternate: each runtime run right after its floor's
        raw.append(b.run_to_done("raw_consume", {**consume, "group": b.name(f"floor-raw-{pair}")}))
        floor.append(b.run_to_done("floor_batch", {**consume, "group": b.name(f"floor-batch-{pair}")}))
        app_batch.append(
            b.run_to_done("app_success_batch", {"topic": source, "group": b.name(f"batch-{pair}"), "n": n})
        )
        failed.append(
            b.run_to_done(
                "floor_failure",
                {"topic": failing, "tier": tier, "group": b.name(f"floor-fail-{pair}"), "n": n_fail, "batch": BATCH},
            )
        )
        app_failed.append(
            b.run_to_done(
                "app_failure",
                {"topic": failing, "group": b.name(f"fail-{pair}"), "n": n_fail},
            )
        )
    headers = _first_headers(b, tier)
    raw_produce = b.run_to_done(
        "raw_produce",
        {"topic": produced, "n": n_fail, "value_size": 100, "headers": [[k, (v or b"").decode()] for k, v in headers]},
    )
    best_raw, best_floor = max(r["rate"] for r in raw), max(f["rate"] for f in floor)
    return [
        Result(
            scenario=f"{NAME}.batch",
            n=n,
            value=best_floor,
            unit="records/s",
            baseline=best_raw,
            extra={"cpu_us_per_record": max(floor, key=lambda f: f["rate"])["cpu_us_per_record"]},
            note="a hand-written batch consumer building one record per message; 1.success.batch's target is 0.8x",
        ),
        Result(
            scenario=f"{NAME}.failure",
            n=n_fail,
            value=max(f["rate"] for f in failed),
            unit="records/s",
            baseline=raw_produce["rate"],
            extra={
                "headers": len(headers),
                "cpu_us_per_record": max(failed, key=lambda f: f["rate"])["cpu_us_per_record"],
            },
            note="a hand-written failure path (describe, 16 headers, commit behind acks); 2.failure's target is 0.5x",
        ),
        _paired("9.runtime.batch", n, app_batch, floor, BATCH_TARGET, "a no-op batch handler"),
        _paired("9.runtime.failure", n_fail, app_failed, failed, FAILURE_TARGET, "a handler that fails"),
    ]


def _paired(
    scenario: str, n: int, app: list[dict[str, Any]], floor: list[dict[str, Any]], target: float, what: str
) -> Result:
    """The median of the ratios runtime / floor over runs made one right after the other."""
    ratios = [a["rate"] / f["rate"] for a, f in zip(app, floor, strict=True)]
    return Result(
        scenario=scenario,
        n=n,
        value=statistics.median(ratios),
        unit="x its floor",
        target=Target(">=", target),
        note=f"{what}: the median of {len(ratios)} ratios runtime / floor, each pair run one after the other "
        f"({', '.join(f'{r:.2f}' for r in ratios)})",
        extra={
            "runtime_rates": ", ".join(f"{a['rate']:.0f}" for a in app),
            "floor_rates": ", ".join(f"{f['rate']:.0f}" for f in floor),
            "runtime_cpu_us_per_record": statistics.median(a["cpu_us_per_record"] for a in app),
            "floor_cpu_us_per_record": statistics.median(f["cpu_us_per_record"] for f in floor),
        },
    )
