"""Profiling the runtime under test: attach py-spy to a child, then summarise the collapsed stacks.

Enabled with ``BENCH_PROFILE=<dir> python -m bench --only ...``: every runtime child (`app_*` roles) is
recorded with ``py-spy record --nonblocking --format raw`` (``--native`` cannot read this interpreter) into ``<dir>/<role>-<pid>.txt``. Summarise with
``python -m bench.profile <file> [--top 25] [--by module]``: the frames (or, with ``--by module``, the source
files) with the most samples, on-CPU only (py-spy drops idle threads by default), as self time and as
inclusive time. A frame's self samples include the cyclic GC runs its allocations set off (py-spy sees Python
frames only), which is why a line that allocates at a record's high-water mark can stand out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

__all__ = ["attach", "summarise"]


def attach(pid: int, role: str) -> subprocess.Popen[bytes] | None:
    """Start recording `pid` if BENCH_PROFILE is set and py-spy is installed; None otherwise."""
    out_dir = os.environ.get("BENCH_PROFILE")
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not out_dir or not role.startswith("app_") or not Path(spy).exists():
        return None
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    out = Path(out_dir) / f"{role}-{pid}.txt"
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--nonblocking", "--rate", "250", "--format", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _frame(raw: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)" so that one function's lines add up.
    name, _, where = raw.partition(" (")
    file = where.rsplit(":", 1)[0].rsplit("/", 1)[-1].rstrip(")")
    return f"{name} ({file})" if file else name


def _module(raw: str) -> str:
    # "function (retrytopics/runtime/loop.py:12)" -> "retrytopics/runtime/loop.py": the source file, so that
    # what one module costs adds up whatever its functions are called
    where = raw.partition(" (")[2].rsplit(":", 1)[0].rstrip(")")
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in where:  # third-party and standard library: by package or module
            return "(lib) " + where.split(marker, 1)[1].lstrip("0123456789./").split("/", 1)[0]
    return where or raw


def summarise(path: Path, top: int = 25, by: str = "frame") -> str:
    """Top frames (or modules, `by="module"`) by self and by inclusive samples, as a markdown-friendly block."""
    name_of = _module if by == "module" else _frame
    self_count: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [name_of(f) for f in stack.split(";")[1:]]  # the first entry is the thread
        if not frames:
            continue
        total += n
        self_count[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{total} samples (on CPU)", "", f"self %  | {by}"]
    lines += [f"{100 * c / total:6.1f} | {f}" for f, c in self_count.most_common(top)]
    lines += ["", f"incl % | {by}"]
    lines += [f"{100 * c / total:6.1f} | {f}" for f, c in inclusive.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--by", choices=("frame", "module"), default="frame")
    args = parser.parse_args()
    print(summarise(args.file, args.top, args.by))


if __name__ == "__main__":
    main()
