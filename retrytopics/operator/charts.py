"""PNG charts people can read (`retrytopics audit --chart`): horizontal bars on a log scale, labelled.

    pipeline_chart("audit.png", title="orders, group billing", stages=[Bar(label="orders", value=2_000_000,
                   kind="source")], failures=[Bar(label="GatewayTimeout", value=12, kind="failure")])

A log scale, because a DLQ of 12 records must still show next to a source of two million; full topic names
on the axis, each bar labelled with its count (and a note such as "12 overdue"), no legend. Needs the
`spark` extra's matplotlib. Labels are untrusted text (exception types come from records): they are drawn
as plain text (no mathtext, so `$...$` is not parsed) with control characters escaped (`reports.safe_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from retrytopics.operator.reports import safe_text

__all__ = ["COLOURS", "Bar", "pipeline_chart"]

#: Bar colour per kind: the stages of a pipeline, and failures.
COLOURS = {"source": "#4C72B0", "tier": "#DD8452", "dlq": "#C44E52", "failure": "#8172B3"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One labelled bar: `label` on the axis, `value` records, `note` after the count."""

    label: str
    value: int
    kind: str
    note: str = ""


#: The longest label drawn (an exception type is at most 256 bytes, more once escaped).
_LABEL_LIMIT = 120


def _count_tick(value: float, _position: int) -> str:
    """1, 10, 100, 1k, 10k, 1M: read at a glance, unlike 10^6."""
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def _bars(axis: Any, bars: Sequence[Bar], title: str) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.barh(range(len(bars)), [max(b.value, 0) for b in bars], color=[COLOURS[b.kind] for b in bars], log=True)
    axis.set_yticks(range(len(bars)), [safe_text(b.label, _LABEL_LIMIT) for b in bars], parse_math=False)
    axis.invert_yaxis()  # first bar on top: the order of the flow
    # at least three decades, so that the labels' offset (x 1.15) stays small next to the bars
    axis.set_xlim(0.7, max(100, *(3 * b.value for b in bars)))
    for y, bar in enumerate(bars):  # a label may pass the axes: the figure is saved tight around it
        text = f"{bar.value:,}" + (f" ({bar.note})" if bar.note else "")
        axis.text(max(bar.value, 0.8) * 1.15, y, text, va="center", fontsize=9, clip_on=False)
    axis.xaxis.set_major_formatter(FuncFormatter(_count_tick))
    axis.grid(axis="x", which="major", alpha=0.3)
    axis.spines[["top", "right"]].set_visible(False)
    axis.set_title(safe_text(title), loc="left", parse_math=False)
    axis.set_xlabel("records (log scale)")


def pipeline_chart(path: str, *, title: str, stages: Sequence[Bar], failures: Sequence[Bar]) -> Any:
    """Write `path` (PNG): records per stage on top, failures by exception type below (or "no failures").
    Returns the closed matplotlib figure, for tests to read."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file is the only output
    import matplotlib.pyplot as plt

    longest = max(len(safe_text(b.label, _LABEL_LIMIT)) for b in [*stages, *failures])
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(6.5 + 0.075 * longest, 2.6 + 0.42 * (len(stages) + len(failures))),
        height_ratios=[len(stages), max(1, len(failures))],
    )
    _bars(top, stages, f"Records per stage: {title}")
    if failures:
        _bars(bottom, failures, "Tier and DLQ records by exception type")
    else:
        bottom.text(0.5, 0.5, "no failures", ha="center", va="center", transform=bottom.transAxes)
        bottom.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return fig
