"""12. Key ordering: the peer scenario's job (bench/peerjobs.py: 20,000 ids, 10 % fail once, 1 % always, tiers
1 s -> 5 s) with 1,000 keys (id i has key `i % 1000`, so 110 keys have every id failing and 890 none), run by a
`RetryApp` without key ordering and with it (`dead_head="dead_letter"`: an always-failing key's followers go to
the DLQ behind its head instead of each passing both tiers in turn), alternately, in child processes.

Figures: the main pass of each (records/s: from the first source call to the source call of the last id of a key
with no failing id; a failing key's later records are handed off behind their head, not called on the source),
with ordering against without (target >= 0.8x); the lateness of tier records with a due time (handled_at -
due_at; a follower has none: it is handled when read behind its head; target p99 <= 50 ms); the end (every id
handled OK or in the DLQ); the unaffected keys' main-pass calls per second, with and without. Every run is
accounted exactly as the peer scenario's: 19,800 ids OK, the 200 always-failing ids in the DLQ once each.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.context import Bench
from bench.report import Result, Target
from bench.scenarios.peer import N, late, median, run_side

NAME = "12.keyorder"
KEYS = 1_000
MAIN_RATIO_TARGET = 0.8
LATENESS_P99_TARGET = 50.0  # ms


def run(b: Bench) -> list[Result]:
    plain: list[dict[str, Any]] = []
    ordered: list[dict[str, Any]] = []
    for _ in range(b.size(1, 3)):
        plain.append(run_side(b, "app_peer", keys=KEYS, ordering=None))
        ordered.append(run_side(b, "app_peer", keys=KEYS, ordering="dead_letter"))
    return _results(plain, ordered)


def _results(plain: list[dict[str, Any]], ordered: list[dict[str, Any]]) -> list[Result]:
    def unaffected_rate(runs: list[dict[str, Any]]) -> float:
        return float(statistics.median(r["main_calls"] / r["main_s"] for r in runs))

    rounds = f"median of {len(ordered)} rounds; " if len(ordered) > 1 else ""
    main, plain_main = median(ordered, "main_rate"), median(plain, "main_rate")
    unaffected, plain_unaffected = unaffected_rate(ordered), unaffected_rate(plain)
    lateness = {"unordered_p50_ms": late(plain, 50), "unordered_p99_ms": late(plain, 99)}
    return [
        Result(
            scenario=f"{NAME}.main",
            n=N,
            value=main,
            unit="records/s",
            baseline=plain_main,
            target=Target(">=", MAIN_RATIO_TARGET, on="ratio"),
            note=f"{rounds}main-topic pass with key ordering, {KEYS:,} keys; baseline: the same job without it",
            extra={
                "unaffected_keys_calls_per_s": unaffected,
                "unaffected_keys_calls_per_s_unordered": plain_unaffected,
                "unaffected_ratio": unaffected / plain_unaffected,
                "main_cpu_us": 1e6 * median(ordered, "main_cpu_s") / N,
                "main_cpu_us_unordered": 1e6 * median(plain, "main_cpu_s") / N,
            },
        ),
        Result(
            scenario=f"{NAME}.end",
            n=N,
            value=median(ordered, "end_s"),
            unit="s",
            baseline=median(plain, "end_s"),
            note="first source record to the last id settled; a failing key's records run one after another",
            extra={
                "dead_lettered": ordered[-1]["dlq_records"],
                "handled_ok": ordered[-1]["ok"],
                # what key order writes: tier records against the same job without ordering, key-state records
                "tier_records": median(ordered, "tier_records"),
                "tier_records_unordered": median(plain, "tier_records"),
                "key_state_records": median(ordered, "key_state_records"),
            },
        ),
        Result(
            scenario=f"{NAME}.lateness.p99",
            n=len(ordered[-1]["lateness_ms"]),
            value=late(ordered, 99),
            unit="ms",
            target=Target("<=", LATENESS_P99_TARGET),
            note=f"tier records with a due time, with key ordering; target <= {LATENESS_P99_TARGET:g} ms",
            extra={**lateness, "p50_ms": late(ordered, 50), "max_ms": late(ordered, 100)},
        ),
    ]
