"""`retrytopics audit` and `retrytopics replay --dry-run`, run as an operator runs them (a subprocess, no
`--json`), print aligned tables and counts in words: no Python reprs (`{'`, `[{`, `None`), and no warning
on stderr (pandas' FutureWarning under pyspark included: pytest's own filter does not reach a subprocess).

Before: the audit printed `by reason: {'exhausted': 1, ...}`, the dry run `sample: [{'partition': 0, ...}]`
on one line and `skipped_already_replayed: None`."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from retrytopics.connectors.config import KafkaConfig

from .conftest import cli_env
from .pipeline_data import build_pipeline

pytestmark = [pytest.mark.broker, pytest.mark.spark]
CLI = str(Path(sys.executable).with_name("retrytopics"))
REPRS = re.compile(r"\{'|\['|\bNone\b|\bTrue\b|\bFalse\b")
WARNINGS = re.compile(r"Warning|\bWARN\b")  # FutureWarning, UserWarning, log4j WARN; not the JVM's "WARNING:"


def assert_aligned(block: str) -> None:
    """Every line has the header's cells (separated by two or more spaces), each column left- or
    right-aligned on every line."""
    lines = block.splitlines()
    spans = [[m.span() for m in re.finditer(r"\S+(?: \S+)*", line)] for line in lines]
    assert all(len(s) == len(spans[0]) for s in spans), f"ragged rows:\n{block}"
    for column in zip(*spans, strict=True):
        assert len({s for s, _ in column}) == 1 or len({e for _, e in column}) == 1, f"not aligned:\n{block}"


def _block(text: str, first_word: str) -> str:
    """The table of `text` whose header starts with `first_word` (blocks are separated by blank lines)."""
    return next(b for b in text.split("\n\n") if b.lstrip().startswith(first_word))


@pytest.mark.timeout(900)  # two Spark driver JVMs side by side, on a machine shared with other work
def test_audit_and_replay_dry_run_print_tables_without_reprs_or_warnings(
    kafka: KafkaConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    # setup: the audit's ground-truth pipeline (two tiers, a DLQ of an exhausted and a non-retryable record)
    topics = build_pipeline(kafka, unique_name("orders"))
    pipeline = [
        "--bootstrap",
        kafka.bootstrap,
        "--topic",
        topics.source,
        "--group",
        "billing",
        "--delays",
        "1s,10s",
        "--master",
        "local[1]",
    ]

    # when: both commands at once (each only reads the pipeline), so their driver JVMs boot side by side
    with ThreadPoolExecutor(max_workers=2) as running:
        audit_run, replay_run = (
            running.submit(subprocess.run, argv, capture_output=True, text=True, timeout=420, env=cli_env())
            for argv in (
                [CLI, "audit", *pipeline, "--chart", str(tmp_path / "audit.png")],
                [CLI, "replay", *pipeline, "--replay-id", "text-1", "--dry-run"],
            )
        )
        audit, replay = audit_run.result(), replay_run.result()

    # then: exit 0, tables, counts in words, no reprs, nothing warned
    for done in (audit, replay):
        assert done.returncode == 0, done.stderr[-3000:]
        assert not REPRS.search(done.stdout), done.stdout
        assert not [line for line in done.stderr.splitlines() if WARNINGS.search(line)], done.stderr[-3000:]
    stages = _block(audit.stdout, "stage")
    assert_aligned(stages)
    assert [line.split()[0] for line in stages.splitlines()[1:]] == [
        topics.source,
        *(t.topic for t in topics.tiers),
        topics.dlq,
    ]
    assert "by reason: exhausted 1, non_retryable 1" in audit.stdout
    assert (tmp_path / "audit.png").read_bytes()[:4] == b"\x89PNG"

    assert replay.stdout.splitlines()[0] == "replay text-1 to the original topic: nothing written (dry run)"
    assert re.search(r"^selected \(match the filters\) +2$", replay.stdout, re.M)
    assert re.search(r"^would write +2$", replay.stdout, re.M), replay.stdout  # neither was replayed from the DLQ
    sample = "\n".join(_block(replay.stdout, "sample").splitlines()[1:])  # under "sample (2 of 2 selected):"
    assert_aligned(sample)
    assert len(sample.splitlines()) == 3 and "exhausted" in sample and "non_retryable" in sample, sample
