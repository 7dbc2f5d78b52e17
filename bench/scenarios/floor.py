"""9. Floors: how close to a ratio target Python can come at all. The floor roles (bench/floor.py) do by hand,
with nothing else, the least any program must do per record to keep retrytopics' contract; each is set
against the raw baseline its target is measured against, in the same run, on the same topics:

- `9.floor.batch`: one immutable record per consumed record, one handler call per poll and partition, vs the
  raw consume loop (`1.success.batch`'s baseline; its target is 0.8x);
- `9.floor.failure`: the handler raises, the failure is described, the record is republished with the 16
  retry headers, positions are committed behind the acknowledgements, vs the raw producer sending the very
  bytes of a retry record (`2.failure`'s baseline; its target is 0.5x).

A target above its floor's ratio cannot be met by any runtime on this machine, however lean.
"""

from __future__ import annotations

from bench.context import Bench
from bench.load import create_topics, fill
from bench.report import Result
from bench.scenarios.failure import _first_headers

NAME = "9.floor"
BATCH = 500


def run(b: Bench) -> list[Result]:
    n, n_fail = b.size(100_000, 1_000_000), b.size(30_000, 300_000)
    source = b.name("floor")
    create_topics(b.kafka, [source], b.partitions)
    fill(b.kafka, source, n, partitions=b.partitions)
    consume = {"topic": source, "n": n, "batch": BATCH, "commit_every": BATCH, "commit_interval_s": 1.0}
    raw, floor = [], []
    for _ in range(b.size(2, 3)):  # alternate, keep each side's best: the broker shares the cores
        raw.append(b.run_to_done("raw_consume", {**consume, "group": b.name("floor-raw")}))
        floor.append(b.run_to_done("floor_batch", {**consume, "group": b.name("floor-batch")}))
    failing, tier, produced = b.name("floor-fail"), b.name("floor-tier"), b.name("floor-produce")
    create_topics(b.kafka, [failing, tier, produced], b.partitions)
    fill(b.kafka, failing, n_fail, partitions=b.partitions)
    failed = b.run_to_done(
        "floor_failure", {"topic": failing, "tier": tier, "group": b.name("floor-fail"), "n": n_fail, "batch": BATCH}
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
            value=failed["rate"],
            unit="records/s",
            baseline=raw_produce["rate"],
            extra={"headers": len(headers), "cpu_us_per_record": failed["cpu_us_per_record"]},
            note="a hand-written failure path (describe, 16 headers, commit behind acks); 2.failure's target is 0.5x",
        ),
    ]
