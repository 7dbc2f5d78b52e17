"""8. Console: with a DLQ of a million records (quick: 100,000), the time to the first DLQ page after the
console starts, a filtered page, a filter matching nothing (it stops at its scan budget), the pipeline page,
the background tally's time to count every record, and the console's peak memory over all of it.

A page reads the DLQ backwards by offset, one block per partition: its time and memory do not grow with
the topic. The tally keeps counters only.
"""

from __future__ import annotations

import importlib.util

from bench.context import Bench
from bench.load import dead_lettered_pipeline
from bench.report import Result

NAME = "8.console"
DELAYS_MS = [3_600_000]


def run(b: Bench) -> list[Result]:
    if importlib.util.find_spec("starlette") is None:
        return [
            Result(scenario=NAME, n=None, value=None, unit="s", note="not measurable: the console extra is missing")
        ]
    n = b.size(100_000, 1_000_000)
    ts = dead_lettered_pipeline(b, "console", DELAYS_MS, n)
    with b.child("console_serve", {"source": ts.source, "group": ts.group, "delays_ms": DELAYS_MS}) as child:
        child.wait_for("ready", timeout_s=120)
        ready_rss = child.peak_rss() / 2**20
        pages = child.wait_for("pages", timeout_s=600)
        pages_rss = child.peak_rss() / 2**20
        done = child.wait_for("done", timeout_s=1800)
        peak = child.peak_rss() / 2**20
    note = f"{n:,} DLQ records over {b.partitions} partitions"
    return [
        Result(
            scenario="8.console.first_page",
            n=n,
            value=pages["first_page_s"],
            unit="s",
            note=f"{note}; cold, the tally running; {pages['rows']} rows",
            extra={"rss_mb_after_pages": pages_rss},
        ),
        Result(
            scenario="8.console.filtered_page",
            n=n,
            value=pages["filtered_page_s"],
            unit="s",
            note="exception type filter matching a third of the records",
        ),
        Result(
            scenario="8.console.no_match_page",
            n=n,
            value=pages["no_match_page_s"],
            unit="s",
            note="origin id filter matching nothing: stops at the 50,000-record scan budget",
        ),
        Result(scenario="8.console.pipeline_page", n=n, value=pages["pipeline_page_s"], unit="s"),
        Result(
            scenario="8.console.tally",
            n=n,
            value=done["tally_s"],
            unit="s",
            note=f"background count of every tier and DLQ record ({done['counted']:,})",
        ),
        Result(
            scenario="8.console.peak_rss",
            n=n,
            value=peak,
            unit="MB",
            note=f"whole life; {ready_rss:.0f} MB when ready, {pages_rss:.0f} MB after the pages",
        ),
    ]
