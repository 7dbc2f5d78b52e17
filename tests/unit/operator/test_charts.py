"""`audit --chart` draws records per stage on a log scale with full topic names and labelled bars.

Before: stacked linear bars where a DLQ of a few records next to a large source was invisible, tick labels
with the source topic's prefix cut off (`billing.retry.1s`), and a legend entry "(none)" for the records
without an exception type (the whole source topic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row

from retrytopics.core.naming import topics_for
from retrytopics.operator import charts
from retrytopics.spark.audit import _chart

TOPICS = topics_for("orders", "billing", (1_000, 10_000))
TIER0, TIER1 = (t.topic for t in TOPICS.tiers)


def _fact(
    topic: str,
    records: int,
    *,
    coarse: bool = False,
    exception_type: str | None = None,
    overdue: int = 0,
    unhandled: int = 0,
) -> Row:
    """One row of `record_facts` (the grouping-set aggregation the audit charts from)."""
    return Row(
        topic=topic,
        exception_type=exception_type,
        dlq_reason=None,
        reconsume_times=None,
        coarse=coarse,
        records=records,
        overdue=overdue,
        unhandled=unhandled,
        age=[0, 0],
    )


def _facts(exception_types: int = 2) -> list[Row]:
    """The audit ground truth (tests/integration/spark/pipeline_data.py), scaled so that the source dwarfs
    the DLQ, plus an undecodable DLQ record (no exception type)."""
    kinds = [f"errors.Kind{i}" for i in range(exception_types)]
    return [
        _fact("orders", 2_000_000, coarse=True),
        _fact("orders", 2_000_000),
        _fact(TIER0, 5, coarse=True, overdue=1, unhandled=3),
        *[_fact(TIER0, 5 - i, exception_type=k) for i, k in enumerate(kinds[:1])],
        _fact(TIER1, 3, coarse=True, unhandled=1),
        _fact(TIER1, 3, exception_type="TimeoutError"),
        _fact(TOPICS.dlq, 3, coarse=True, unhandled=3),
        _fact(TOPICS.dlq, 2, exception_type="ValueError"),
        _fact(TOPICS.dlq, 1, exception_type=None),
        *[_fact(TOPICS.dlq, 1, exception_type=k) for k in kinds[1:]],
    ]


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures `_chart` draws (it keeps none)."""
    figures: list[Any] = []
    real = charts.pipeline_chart
    monkeypatch.setattr(charts, "pipeline_chart", lambda *a, **kw: figures.append(real(*a, **kw)))
    return figures


def _texts(axis: Any) -> list[str]:
    return [t.get_text() for t in axis.texts]


def test_stages_in_flow_order_with_full_names_on_a_log_scale_and_no_legend(tmp_path: Path, drawn: list[Any]) -> None:
    png = tmp_path / "audit.png"
    _chart(_facts(), TOPICS, str(png))

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (figure,) = drawn
    stages, failures = figure.axes
    assert [t.get_text() for t in stages.get_yticklabels()] == ["orders", TIER0, TIER1, TOPICS.dlq]
    assert stages.get_xscale() == failures.get_xscale() == "log"
    # every bar is labelled with its count and what still waits: the DLQ's 3 records show beside 2 million
    assert _texts(stages) == ["2,000,000", "5 (2 waiting, 1 overdue)", "3 (1 waiting)", "3"]
    assert [p.get_width() for p in stages.patches] == [2_000_000, 5, 3, 3]
    assert [t.get_text() for t in failures.get_yticklabels()] == [
        "errors.Kind0",
        "TimeoutError",
        "ValueError",
        "unknown",
        "errors.Kind1",
    ]
    assert figure.legends == [] and stages.get_legend() is None and failures.get_legend() is None
    everything = [t.get_text() for ax in figure.axes for t in [*ax.texts, *ax.get_yticklabels(), ax.title]]
    assert not [t for t in everything if "none" in t.lower()], everything


def test_many_exception_types_end_in_other_and_none_says_so(tmp_path: Path, drawn: list[Any]) -> None:
    _chart(_facts(exception_types=12), TOPICS, str(tmp_path / "many.png"))
    labels = [t.get_text() for t in drawn[0].axes[1].get_yticklabels()]
    assert len(labels) == 9 and labels[-1] == "other"

    quiet = [_fact("orders", 10, coarse=True), _fact("orders", 10)]
    _chart(quiet, TOPICS, str(tmp_path / "quiet.png"))
    assert _texts(drawn[1].axes[0]) == ["10", "0", "0", "0"]
    assert _texts(drawn[1].axes[1]) == ["no failures"]


def test_labels_from_records_are_drawn_as_plain_text(tmp_path: Path, drawn: list[Any]) -> None:
    """An exception type is record data: `$...$` (matplotlib mathtext, which crashed the chart on a
    malformed expression) and control characters are drawn literally, escaped."""
    facts = [
        _fact("orders", 10, coarse=True),
        _fact("orders", 10),
        _fact(TOPICS.dlq, 2, coarse=True),
        _fact(TOPICS.dlq, 1, exception_type="$\\frac{x$"),
        _fact(TOPICS.dlq, 1, exception_type="Err\x1b[2J\x07"),
    ]
    png = tmp_path / "hostile.png"
    _chart(facts, TOPICS, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"
    labels = drawn[0].axes[1].get_yticklabels()
    assert [t.get_text() for t in labels] == ["$\\frac{x$", "Err\\x1b[2J\\x07"]
    assert not any(t.get_parse_math() for t in labels)
