"""Text output for people: aligned columns, no Python reprs (`{'`, `[`, `None`), numbers in words.

Before: the audit printed `by reason: {'exhausted': 1, ...}` and a stage table whose columns slipped past a
44-character topic name, and a replay dry run printed `sample: [{'partition': 0, ...}]` (about 1,500
characters on one line) and `skipped_already_replayed: None`."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.operator.reports import counts, duration, key_values, replay_text, safe_text, table
from retrytopics.spark.audit import format_table

REPRS = re.compile(r"\{'|\['|\bNone\b|\bTrue\b|\bFalse\b|\{\}")
LONG = "orders-with-a-long-name.billing-and-invoicing.retry.30s"  # longer than the old 44-character column


def assert_aligned(block: str) -> None:
    """Every line of `block` has as many cells as the first (cells are separated by two or more spaces), and
    each column starts at one offset (left-aligned) or ends at one (right-aligned) on every line."""
    lines = block.splitlines()
    spans = [[m.span() for m in re.finditer(r"\S+(?: \S+)*", line)] for line in lines]
    assert all(len(s) == len(spans[0]) for s in spans), f"ragged rows:\n{block}"
    for i, column in enumerate(zip(*spans, strict=True)):
        starts, ends = {start for start, _ in column}, {end for _, end in column}
        assert len(starts) == 1 or len(ends) == 1, f"column {i} is not aligned:\n{block}"


def test_the_alignment_check_catches_a_slipped_column() -> None:
    assert_aligned("a    bb\nccc   d")
    with pytest.raises(AssertionError):
        assert_aligned("stage  records\norders-with-a-long-name  12")
    with pytest.raises(AssertionError):
        assert_aligned("a  b\nc  d  e")


def test_tables_pad_columns_and_align_numbers_right() -> None:
    text = table(["topic", "records", "lag"], [["orders", 2000, None], [LONG, 7, 3]])
    assert_aligned(text)
    w = len(LONG)
    assert text.splitlines() == [
        f"{'topic':<{w}}  records  lag",
        f"{'orders':<{w}}     2000    -",
        f"{LONG}        7    3",
    ]
    assert not any(line != line.rstrip() for line in text.splitlines())
    assert table(["a", "b"], [["x", "1.0s"]], align="lr").splitlines()[1] == "x  1.0s"
    with pytest.raises(ValueError, match="2 columns"):
        table(["a", "b"], [["only one"]])
    with pytest.raises(ValueError, match="align"):
        table(["a", "b"], [], align="lx")


def test_values_are_written_as_people_read_them() -> None:
    assert [duration(ms) for ms in (None, 0, 999, 1000, 12_345, 60_000, 245_000, 7_800_000)] == [
        "-",
        "0ms",
        "999ms",
        "1.0s",
        "12.3s",
        "1m00s",
        "4m05s",
        "2h10m",
    ]
    assert counts({"exhausted": 10, "None": 2}) == "exhausted 10, unknown 2"
    assert counts({}) == "none"
    assert key_values([("selected", 25), ("would write", 7)]) == "selected     25\nwould write   7"


def _summary() -> dict[str, Any]:
    """An audit summary as `audit()` returns it (the ground truth of tests/integration/spark/test_audit.py),
    with one long topic name."""
    stage = {"overdue": 0, "unhandled": 0, "age_ms_p50": 5_300, "age_ms_max": 9_100}
    return {
        "source": "orders",
        "group": "billing",
        "now_ms": 1,
        "grace_ms": 60_000,
        "stages": [
            {**stage, "topic": "orders", "kind": "source", "records": 7},
            {**stage, "topic": "orders.billing.retry.1s", "kind": "tier", "records": 5, "overdue": 1, "unhandled": 1},
            {**stage, "topic": LONG, "kind": "tier", "records": 3},
            {
                **stage,
                "topic": "orders.billing.dlq",
                "kind": "dlq",
                "records": 2,
                "unhandled": None,
                "age_ms_p50": None,
                "age_ms_max": None,
            },
        ],
        "dlq": {
            "records": 2,
            "by_reason": {"exhausted": 1, "non_retryable": 1},
            "by_exception_type": {"TimeoutError": 1, "None": 1},
            "replayed": 1,
            "pending": 1,
        },
        "by_exception_type": {"TimeoutError": 9},
        "reconsume_times": {"1": 6, "2": 3, "3": 1},
        "lineage": {
            "episodes": 6,
            "by_outcome": {"dead_lettered": 2, "in_flight": 2, "recovered": 2},
            "recovered": 2,
            "attempts_p50": 2,
            "attempts_p99": 3,
            "time_to_recover_ms_p50": 1000,
            "time_to_recover_ms_p99": 20_000,
            "tiers": [
                {"topic": "orders.billing.retry.1s", "handled": 4, "recovered": 1, "success_rate": 0.25},
                {"topic": LONG, "handled": 0, "recovered": 0, "success_rate": None},
            ],
        },
    }


def _blocks(text: str) -> list[str]:
    return [block for block in text.split("\n\n") if block.strip()]


def test_the_audit_prints_aligned_tables_and_no_reprs() -> None:
    text = format_table(_summary())
    assert not REPRS.search(text), text
    stages = next(b for b in _blocks(text) if b.startswith("stage"))
    assert_aligned(stages)
    assert stages.splitlines()[0].split() == [
        "stage",
        "kind",
        "records",
        "overdue",
        "unhandled",
        "age",
        "p50",
        "age",
        "max",
    ]
    assert re.search(rf"^{re.escape(LONG)} +tier +3 +0 +0 +5\.3s +9\.1s$", stages, re.M)
    assert re.search(r"^orders\.billing\.dlq +dlq +2 +0 +- +- +-$", stages, re.M)
    tiers = next(b for b in _blocks(text) if b.startswith("tier"))
    assert_aligned(tiers)
    assert re.search(r"^orders\.billing\.retry\.1s +4 +1 +25\.0%$", tiers, re.M)
    assert "by reason: exhausted 1, non_retryable 1" in text and "TimeoutError 1, unknown 1" in text
    assert "6 with 1 failure, 3 with 2 failures, 1 with 3 failures" in text
    assert "2 / 3 attempts, 1.0s / 20.0s after the first failure" in text


def _replay_result(**changes: Any) -> dict[str, Any]:
    sample = [
        {
            "partition": 0,
            "offset": i,
            "origin_message_id": f"orders-0-{i}",
            "dlq_reason": "exhausted",
            "exception_type": "examples.billing.GatewayTimeout",
            "replay_count": None if i else 1,
            "destination": "orders",
        }
        for i in range(10)
    ]
    result = {
        "replay_id": "fix-1234",
        "dry_run": True,
        "destination": "original",
        "selected": 25,
        "skipped_duplicates": 1,
        "skipped_foreign": 0,
        "skipped_invalid": 2,
        "skipped_max_replays": 3,
        "parked": 0,
        "destination_topics": ["orders"],
        "skipped_invalid_by_problem": {"original_partition": 2},
        "written": 0,
        "skipped_already_replayed": None,
        "sample": sample,
    }
    return {**result, **changes}


def test_a_replay_dry_run_prints_counts_and_its_sample_as_tables() -> None:
    text = replay_text(_replay_result())
    assert not REPRS.search(text), text
    assert max(len(line) for line in text.splitlines()) < 120
    first, counts_block, sample_block = _blocks(text)
    assert first == "replay fix-1234 to the original topic: nothing written (dry run)"
    assert_aligned("\n".join(line for line in counts_block.splitlines() if "  " in line))
    assert re.search(r"^would write +19$", counts_block, re.M)  # 25 selected - 1 - 2 - 3 skipped
    assert "invalid by problem: original_partition 2" in counts_block
    rows = sample_block.splitlines()[1:]
    assert rows[0].split() == [
        "partition",
        "offset",
        "origin_message_id",
        "dlq_reason",
        "exception_type",
        "replay_count",
        "destination",
    ]
    assert_aligned("\n".join(rows))
    assert len(rows) == 11 and rows[2].split()[5] == "-"


def test_a_replay_that_wrote_says_how_many_and_why_it_skipped_the_rest() -> None:
    result = _replay_result(dry_run=False, written=17, skipped_already_replayed=2)
    del result["sample"]
    text = replay_text(result)
    assert not REPRS.search(text), text
    assert text.splitlines()[0] == "replay fix-1234 to the original topic: 17 written"
    assert re.search(r"^skipped: written by an earlier run of this id +2$", text, re.M)
    assert re.search(r"^written +17$", text, re.M) and "would write" not in text


def test_a_replay_names_the_broker_dlq_it_did_not_replay_outside_the_selected_count() -> None:
    """The broker DLQ's dead letters are not among the selected: a dry run's "would write" stays
    selected minus skipped, and one line says how many broker dead letters were not replayed, by reason."""
    broker = {"topic": "dlq.billing", "counted": 6, "by_reason": {"broker_rejected": 4, "broker_delivery_limit": 2}}
    text = replay_text(_replay_result(broker_dlq=broker, skipped_broker_dlq=6))
    assert re.search(r"^would write +19$", text, re.M)
    assert (
        "broker DLQ dlq.billing: 6 not replayed (no headers copied), by reason: broker_rejected 4, "
        "broker_delivery_limit 2"
    ) in text.splitlines()


HOSTILE = "\x1b]0;owned\x07\x1b[2J\u202eevil\r\n" + "\x1b" * 500  # title change, bell, clear screen, bidi


def _no_control_characters(text: str) -> None:
    assert all(line.isprintable() for line in text.splitlines()), repr(text)
    assert "\r" not in text


def test_record_text_reaches_the_terminal_escaped_and_shortened() -> None:
    """Exception types and origin ids are record data: the audit and a replay dry run print their control
    characters as escapes (`\\x1b`), never raw, and a long one shortened."""
    summary = _summary()
    summary["dlq"]["by_exception_type"] = {HOSTILE: 1}
    summary["by_exception_type"] = {HOSTILE: 2}
    audit_text = format_table(summary)
    _no_control_characters(audit_text)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\u202eevil\\r\\n" in audit_text
    assert max(len(line) for line in audit_text.splitlines()) < 160

    sample = [
        {
            "partition": 0,
            "offset": 1,
            "origin_message_id": HOSTILE,
            "dlq_reason": "exhausted",
            "exception_type": HOSTILE,
            "replay_count": None,
            "destination": "orders",
        }
    ]
    replay = replay_text(_replay_result(sample=sample, skipped_invalid_by_problem={HOSTILE: 1}))
    _no_control_characters(replay)
    assert "\\x1b]0;owned" in replay and max(len(line) for line in replay.splitlines()) < 200


@given(text=st.text(), limit=st.one_of(st.none(), st.integers(1, 80)))
def test_safe_text_is_printable_bounded_and_leaves_printable_text_alone(text: str, limit: int | None) -> None:
    """Whatever the text: the result is printable and at most `limit` long; printable text within the
    limit comes back unchanged, and a cut one ends in "…"."""
    out = safe_text(text, limit)
    assert out.isprintable()
    if limit is not None:
        assert len(out) <= limit
    if text.isprintable() and (limit is None or len(text) <= limit):
        assert out == text
    elif limit is not None and out != "".join(safe_text(c) for c in text):
        assert out.endswith("…")
