"""``python -m bench [--quick] [--broker apache|tansu] [--only SCENARIO ...] [--no-docs]``: run the benchmarks
on a local broker the command starts itself (Apache Kafka by default; the report names it).

Prints one line per figure, writes bench/results.json and regenerates docs/benchmarks.md (--no-docs: the JSON
only). A partial run (--only) writes bench/out/results-partial.json instead and never touches the full report.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from bench.context import Bench
from bench.report import Result, format_line, machine, render_markdown, write_json
from bench.scenarios import ALL
from retrytopics.connectors.brokers import BROKER_NAMES, local_broker

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
PARTIAL = ROOT / "bench" / "out" / "results-partial.json"
DOCS = ROOT / "docs" / "benchmarks.md"
FINDINGS = ROOT / "bench" / "findings.md"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller N; under 3 minutes on 2 cores")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SCENARIO",
        help="run scenarios whose name, with or without its number, starts with this "
        "(e.g. 3, 3.lateness or failover); repeatable",
    )
    parser.add_argument(
        "--broker",
        choices=BROKER_NAMES,
        default="apache",
        help="apache (Apache Kafka from the Maven cache, the default) or tansu (embedded)",
    )
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/benchmarks.md")
    return parser.parse_args(argv)


def _matches(name: str, wanted: str) -> bool:
    # "3", "3.lateness" or "lateness": a scenario's number, its full name, or its name without the number; a
    # bare number is the whole number ("1" is 1.success, never 10.failover)
    number, _, rest = name.partition(".")
    if wanted.isdigit():
        return number == wanted
    return name.startswith(wanted) or rest.startswith(wanted)


def _selected(only: list[str]) -> list[object]:
    chosen = [m for m in ALL if not only or any(_matches(m.NAME, o) for o in only)]
    if not chosen:
        raise SystemExit(f"no scenario matches {only}; scenarios: {[m.NAME for m in ALL]}")
    return chosen


def _run_one(module: object, bench: Bench) -> list[Result]:
    name = module.NAME  # type: ignore[attr-defined]
    start = time.monotonic()
    try:
        results = module.run(bench)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others' figures
        traceback.print_exc()
        results = [Result(scenario=name, n=None, value=None, unit="-", note=f"failed: {exc!r}"[:300])]
    print(f"  ({name}: {time.monotonic() - start:.0f} s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.monotonic()
    results: list[Result] = []
    with local_broker(args.broker) as broker:
        described = broker.description
        bench = Bench(bootstrap=broker.bootstrap, quick=args.quick, broker=broker.kind)
        print(f"broker {described} at {broker.bootstrap}; {'quick' if args.quick else 'full'} mode", flush=True)
        for module in _selected(args.only):
            for result in _run_one(module, bench):
                results.append(result)
                print(format_line(result), flush=True)
    wall_s = time.monotonic() - started
    print(f"total wall time {wall_s:.0f} s", flush=True)
    # A partial run never replaces the full report: it goes next to the other scratch output.
    out = PARTIAL if args.only else RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(results, out)
    if args.only:
        print(f"wrote {out.relative_to(ROOT)} (a partial run; {RESULTS.relative_to(ROOT)} is left as it was)")
    if not args.only and not args.no_docs:
        findings = FINDINGS.read_text() if FINDINGS.exists() else ""
        DOCS.write_text(
            render_markdown(
                results,
                info=machine(),
                mode="quick" if args.quick else "full",
                broker=described,
                wall_s=wall_s,
                findings=findings,
            )
        )
        print(f"wrote {RESULTS.relative_to(ROOT)} and {DOCS.relative_to(ROOT)}")
    return 0 if all(r.value is not None or r.note.startswith("not yet") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
