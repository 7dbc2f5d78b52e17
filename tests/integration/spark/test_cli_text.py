"""`retrytopics audit` and `retrytopics replay --dry-run`, as the command line runs them (its `main`, no
`--json`), print aligned tables and counts in words: no Python reprs (`{'`, `[{`, `None`), no warning.

The commands run in this process on the Spark tests' session (`get_session` returns the active one), so no
driver JVM starts cold: the same parsing, job and printing as the command, on real Spark rows. That a cold
command, run as a user runs it, writes no warning or log line on stderr (pandas' FutureWarning in the Python
workers, log4j's WARN lines) is checked where such runs happen anyway: the README tour's `audit` and
`replay --dry-run` (test_readme_tour.py) and the replay command of test_replay_input.py.

Before: the audit printed `by reason: {'exhausted': 1, ...}`, the dry run `sample: [{'partition': 0, ...}]`
on one line and `skipped_already_replayed: None`."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.operator import cli
from retrytopics.spark.session import quiet_python_warnings

from .pipeline_data import build_pipeline

pytestmark = [pytest.mark.broker, pytest.mark.spark]
REPRS = re.compile(r"\{'|\['|\bNone\b|\bTrue\b|\bFalse\b")
WARNINGS = re.compile(r"Warning|\bWARN\b")  # FutureWarning, UserWarning, a WARN log line


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


def _command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `retrytopics <argv>` in this process, as its own process would (the warning filter a new session
    installs included); its stdout, after checking exit 0, no warning raised and none printed."""
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        quiet_python_warnings()
        assert cli.main(argv) == 0, capsys.readouterr().err[-3000:]
    out, err = capsys.readouterr()
    assert [str(w.message) for w in raised] == []
    assert not [line for line in err.splitlines() if WARNINGS.search(line)], err[-3000:]
    assert not REPRS.search(out), out
    return out


def test_audit_and_replay_dry_run_print_tables_without_reprs_or_warnings(
    spark: SparkSession,
    kafka: KafkaConfig,
    unique_name: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # setup: the audit's ground-truth pipeline (two tiers, a DLQ of an exhausted and a non-retryable record);
    # the commands find the tests' session active (`spark`)
    topics = build_pipeline(kafka, unique_name("orders"))
    pipeline = ["--bootstrap", kafka.bootstrap, "--topic", topics.source, "--group", "billing", "--delays", "1s,10s"]
    monkeypatch.setenv("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", ""))  # quiet_python_warnings sets it

    # when
    audited = _command(["audit", *pipeline, "--chart", str(tmp_path / "audit.png")], capsys)
    replayed = _command(["replay", *pipeline, "--replay-id", "text-1", "--dry-run"], capsys)

    # then: tables, counts in words (no reprs, nothing warned: `_command`)
    stages = _block(audited, "stage")
    assert_aligned(stages)
    assert [line.split()[0] for line in stages.splitlines()[1:]] == [
        topics.source,
        *(t.topic for t in topics.tiers),
        topics.dlq,
    ]
    assert "by reason: exhausted 1, non_retryable 1" in audited
    assert (tmp_path / "audit.png").read_bytes()[:4] == b"\x89PNG"

    assert replayed.splitlines()[0] == "replay text-1 to the original topic: nothing written (dry run)"
    assert re.search(r"^selected \(match the filters\) +2$", replayed, re.M)
    assert re.search(r"^would write +2$", replayed, re.M), replayed  # neither was replayed from the DLQ
    sample = "\n".join(_block(replayed, "sample").splitlines()[1:])  # under "sample (2 of 2 selected):"
    assert_aligned(sample)
    assert len(sample.splitlines()) == 3 and "exhausted" in sample and "non_retryable" in sample, sample
