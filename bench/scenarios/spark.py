"""7. Spark: the retrytopics-kafka reader's records/s on a DLQ topic vs a single-process confluent-kafka read
of the same topic in the same run, and the audit job's wall time on that pipeline, with local[2]; where
Spark's own Kafka connector is in the cache, the same read and audit through `format("kafka")` side by side.

On tansu the topic is filled one record per produce batch: Spark plans its read from end offsets, which
batched produces make that broker under-report. Apache Kafka takes ordinary batches.
"""

from __future__ import annotations

import importlib.util

from bench.context import Bench
from bench.load import dead_lettered_pipeline
from bench.report import Result

NAME = "7.spark"
DELAYS_MS = [3_600_000]


def _missing() -> str | None:
    for module in ("pyspark", "retrytopics.connectors.spark_kafka", "retrytopics.spark.audit"):
        if importlib.util.find_spec(module) is None:
            return module
    return None


def run(b: Bench) -> list[Result]:
    missing = _missing()
    if missing is not None:
        note = f"not yet measurable: {missing} is not importable"
        return [
            Result(scenario="7.spark.read", n=None, value=None, unit="records/s", note=note),
            Result(scenario="7.spark.audit", n=None, value=None, unit="s", note=note),
        ]
    n = b.size(20_000, 1_000_000)  # quick: one-record batches load at ~7k/s, and the audit is ~1 ms/record
    ts = dead_lettered_pipeline(b, "spark", DELAYS_MS, n)
    raw = b.run_to_done("raw_read", {"topic": ts.dlq, "n": n})
    with b.child("spark_jobs", {"source": ts.source, "group": ts.group, "delays_ms": DELAYS_MS}) as child:
        read = child.wait_for("read", timeout_s=1800)
        done = child.wait_for("done", timeout_s=1800)
    results = [
        _read_result("7.spark.read", n, read["python"], raw["rate"]),
        Result(
            scenario="7.spark.audit",
            n=n,
            value=done["python"]["seconds"],
            unit="s",
            note=f"audit of {done['python']['dlq_records']:,} DLQ records, local[2]",
            extra={"master": "local[2]"},
        ),
    ]
    builtin_read, builtin_audit = read.get("builtin"), done.get("builtin")
    if builtin_read and builtin_audit:
        # Spark's own connector in the same session, same topic: the Python source's ratio against it
        results.append(_read_result("7.spark.read.builtin", n, builtin_read, raw["rate"]))
        results.append(
            Result(
                scenario="7.spark.audit.builtin",
                n=n,
                value=builtin_audit["seconds"],
                unit="s",
                baseline=done["python"]["seconds"],
                extra={"master": "local[2]"},
                note=f"format('kafka'); ratio = builtin / python seconds; same answer: {builtin_audit['same_summary']}",
            )
        )
    return results


def _read_result(scenario: str, n: int, read: dict[str, float], raw_rate: float) -> Result:
    note = "" if read["count"] == n else f"the reader returned {read['count']} of {n} records"
    return Result(
        scenario=scenario,
        n=n,
        value=read["rate"],
        unit="records/s",
        baseline=raw_rate,
        note=note,
        extra={"warm_read_s": read["seconds"], "cold_read_s": read["cold_seconds"], "master": "local[2]"},
    )
