"""``python -m bench.walk [--tree PATH]``: the walk of one failed tier record through the package's modules.

On the in-memory broker (the runtime's unit-test kit, tests/unit/runtime/kit.py, of the tree measured), one tier
record that is due fails and is handed off to the next tier. Every call into a module of the package (the core,
observe, the runtime; the in-memory broker left out: it stands where Kafka is) is recorded from the `consume`
that returns the record to the commit that covers it, consecutive calls within one module counted once. It
prints the modules crossed, the re-entries (a call into a module this walk had left already) and the walk
itself. Run it on two trees (`--tree` another checkout: its own kit and package are imported) to compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

__all__ = ["main"]

_LEFT_OUT = ("retrytopics.testing", "retrytopics.memory", "retrytopics.client_factory")


def _kit(tree: Path) -> ModuleType:
    sys.path[:0] = [str(tree), str(tree / "tests" / "unit" / "runtime")]
    spec = importlib.util.spec_from_file_location("kit", tree / "tests" / "unit" / "runtime" / "kit.py")
    assert spec is not None and spec.loader is not None
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    return kit


class _Marked:
    """The loop's consumer, marking in the walk when it returned records and when it committed."""

    def __init__(self, consumer: Any, walk: list[str]) -> None:
        self._consumer, self._walk = consumer, walk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def consume(self, max_records: int, timeout_s: float) -> list[Any]:
        out = self._consumer.consume(max_records, timeout_s)
        if out:
            self._walk.append("<consumed>")
        return list(out)

    def commit(self, offsets: Any, *, asynchronous: bool) -> None:
        self._walk.append(f"<commit {dict(offsets)}>")
        self._consumer.commit(offsets, asynchronous=asynchronous)


def _between(walk: list[str], tier: str) -> Iterator[str]:
    """The walk from the consume that returned the record to the first commit covering its offset 0."""
    started = False
    for step in walk:
        if step == "<consumed>":
            started = True
        elif started and step.startswith("<commit") and f"('{tier}', 0): " in step:
            return
        elif started and not step.startswith("<"):
            yield step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.walk", description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    kit = _kit(args.tree.resolve())
    broker = kit.new_broker()
    kit.tier_record(broker, 0, "fails", failed_ago_ms=6_000)  # due already
    ledger = kit.Ledger(broker, failing={"fails"})
    stop = kit.StopWhen(kit.committed_all(broker, kit.TIER, {0: 1}, topic=kit.TIER))
    walk: list[str] = []
    consumer = _Marked(broker.consumer(kit.TIER), walk)
    loop = kit.build_loop(broker, ledger, stop, topic=kit.TIER, consumer=consumer)

    def called(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        # a call from another module only: a module's calls to its own functions are not a re-entry
        if module.startswith("retrytopics.") and not module.startswith(_LEFT_OUT) and caller != module:
            if not walk or walk[-1] != module:
                walk.append(module)

    sys.setprofile(called)
    try:
        kit.run(loop, stop)
    finally:
        sys.setprofile(None)
    steps = list(_between(walk, kit.TIER))
    runtime = [m for i, m in enumerate(steps) if m.startswith("retrytopics.runtime.")]
    runtime = [m for i, m in enumerate(runtime) if i == 0 or runtime[i - 1] != m]
    for name, path in (("every module", steps), ("runtime modules", runtime)):
        modules, reentries = _reentries(path)
        print(f"{name}: {modules} modules, {reentries} re-entries, {len(path)} steps")
    print(" -> ".join(m.removeprefix("retrytopics.runtime.") for m in runtime))


def _reentries(path: list[str]) -> tuple[int, int]:
    seen: set[str] = set()
    reentries = 0
    for module in path:
        reentries += module in seen
        seen.add(module)
    return len(seen), reentries


if __name__ == "__main__":
    main()
