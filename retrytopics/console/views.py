"""What the console's pages show, as plain values: pure functions from entries, partition states and the
tally to dicts and lists the templates render (with autoescaping) and the JSON endpoint returns.

Record content stays text here: the templates escape it. Exception messages, traces and every header value
are redacted again on display (`retrytopics.core.redaction`): the writer redacted the exception headers with its
own patterns, and anyone who can write to the DLQ can write anything. A value is shown only when revealed, through the app's deserializer when
there is one, else as UTF-8 text or a hex dump, cut to `SHOWN_BYTES`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from retrytopics.console.entries import Entry
from retrytopics.console.tally import Tally
from retrytopics.core.headers import RETRY_PREFIX, user_headers
from retrytopics.core.naming import TopicSet
from retrytopics.core.redaction import redact, redact_header
from retrytopics.operator.ops import PartitionState, printable

__all__ = [
    "SHOWN_BYTES",
    "SHOWN_HEADERS",
    "RecordView",
    "chart_geometry",
    "instant",
    "lineage_hops",
    "pipeline_view",
    "record_view",
    "safe_record_view",
    "value_text",
]

SHOWN_BYTES: Final = 4096
_SHOWN_CHARS: Final = 8192
Render = Callable[[Entry], Any]


def instant(ms: int | None) -> str:
    """Epoch milliseconds as ISO-8601 UTC with milliseconds ("" for None or a negative time)."""
    if ms is None or ms < 0:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def value_text(data: bytes | None, *, limit: int = SHOWN_BYTES) -> str:
    """UTF-8 text as it is (newlines kept), anything else as a hex dump; at most `limit` bytes shown."""
    if data is None:
        return "(null)"
    shown, cut = data[:limit], len(data) > limit
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError:
        text = " ".join(shown[i : i + 16].hex(" ") for i in range(0, len(shown), 16))
    return text + (f"\n… ({len(data)} bytes in all)" if cut else "")


def _rendered(entry: Entry, render: Render | None) -> str:
    if render is None or entry.value is None or len(entry.value) < entry.value_size:
        return value_text(entry.value)
    try:
        value = render(entry)
    except Exception as exc:  # noqa: BLE001 - the app's deserializer refusing these bytes is worth showing
        return f"(the app's deserializer refused it: {type(exc).__name__})\n" + value_text(entry.value)
    if isinstance(value, bytes | bytearray):
        return value_text(bytes(value))
    try:
        text = json.dumps(value, indent=2, sort_keys=True, default=repr, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _shown(name: str, data: bytes | None) -> str | None:
    """A header value as shown: printable, bounded, and redacted (a header can carry a token as well as an
    exception text can; one named as a secret, `authorization`, is hidden whole)."""
    text = printable(data, 200)
    return None if text is None else redact_header(name, text)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordView:
    """One DLQ record as a page shows it: every field but the coordinates optional, so a record missing any
    of them still renders. `parse_error`: why the record could not be shown field by field (then only its
    coordinates, its raw headers and that reason are); `header_error`: why its retry headers do not decode."""

    coordinates: str
    partition: int
    offset: int
    time: str = ""
    key: str | None = None
    value_size: int = 0
    headers: tuple[tuple[str, str | None], ...] = ()
    retry_headers: tuple[tuple[str, str | None], ...] = ()
    headers_not_shown: int = 0
    header_error: str | None = None
    parse_error: str | None = None
    value: str | None = None
    replay_count: int | None = None
    replay_id: str | None = None
    reason: str | None = None
    attempts: int | None = None
    origin_id: str | None = None
    original: str | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    exception_trace: str | None = None
    first_failed: str = ""
    last_failed: str = ""


#: Headers a page shows of one record (a hostile record may carry thousands; the count of the rest is shown).
SHOWN_HEADERS: Final = 100


def _shown_headers(pairs: Sequence[tuple[str, bytes | None]]) -> tuple[tuple[str, str | None], ...]:
    return tuple((printable(name.encode("utf-8", "replace"), 200) or "", _shown(name, data)) for name, data in pairs)


def record_view(entry: Entry, *, reveal: bool = False, render: Render | None = None) -> RecordView:
    """One DLQ record for the browser: coordinates, decoded retry headers, user headers, redacted
    exception and trace, and the value only when `reveal`."""
    retry = entry.retry
    every = list(entry.headers)
    user = user_headers(every)
    own = [(name, data) for name, data in every if name.startswith(RETRY_PREFIX)]
    decoded: dict[str, Any] = {}
    if retry is not None:
        decoded = {
            "reason": retry.dlq_reason.value if retry.dlq_reason else None,
            "attempts": retry.reconsume_times,
            "origin_id": retry.origin_message_id,
            "original": f"{retry.original_topic}[{retry.original_partition}]@{retry.original_offset}",
            "exception_type": retry.exception_type,
            "exception_message": redact(retry.exception_message),
            "exception_trace": redact(retry.exception_trace),
            "first_failed": instant(retry.first_failed_at),
            "last_failed": instant(retry.last_failed_at),
        }
    return RecordView(
        coordinates=entry.coordinates,
        partition=entry.partition,
        offset=entry.offset,
        time=instant(entry.timestamp_ms),
        key=printable(entry.key),
        value_size=entry.value_size,
        headers=_shown_headers(user[:SHOWN_HEADERS]),
        retry_headers=_shown_headers(own[:SHOWN_HEADERS]),
        headers_not_shown=max(0, len(user) - SHOWN_HEADERS) + max(0, len(own) - SHOWN_HEADERS) + entry.headers_cut,
        header_error=entry.header_error,
        value=_rendered(entry, render) if reveal else None,
        replay_count=entry.lineage.replay_count,
        replay_id=entry.lineage.replay_id,
        **decoded,
    )


def safe_record_view(entry: Entry, *, reveal: bool = False, render: Render | None = None) -> RecordView:
    """`record_view`, or when anything in the record makes it fail, a view of what surely shows: the
    coordinates, the raw headers (printable, bounded, redacted) and why (one record never fails a page)."""
    try:
        return record_view(entry, reveal=reveal, render=render)
    except Exception as exc:  # noqa: BLE001 - any record's bytes must not take the page down
        try:
            raw = _shown_headers(list(entry.headers)[:SHOWN_HEADERS])
        except Exception:  # noqa: BLE001 - not even the headers show
            raw = ()
        return RecordView(
            coordinates=entry.coordinates,
            partition=entry.partition,
            offset=entry.offset,
            retry_headers=raw,
            parse_error=f"{type(exc).__name__}: {str(exc)[:200]}",
        )


def pipeline_view(
    rows: Sequence[PartitionState], tally: Tally, topics: TopicSet, *, now_ms: int, counted: tuple[int, int]
) -> dict[str, Any]:
    """The pipeline page's data: one stage per topic (records, lag, heads waiting and overdue), DLQ counts by
    reason and exception type, each tier's recovery, and the chart's series. `counted`: (records tallied,
    records in the tiers and DLQ)."""
    stages: dict[str, dict[str, Any]] = {}
    for row in rows:
        stage = stages.setdefault(
            row.topic,
            {
                "topic": row.topic,
                "kind": row.kind,
                "records": 0,
                "lag": None,
                "waiting": 0,
                "overdue": 0,
                "partitions": 0,
            },
        )
        stage["records"] += row.end_offset
        stage["partitions"] += 1
        if row.lag is not None:
            stage["lag"] = (stage["lag"] or 0) + row.lag
        stage["waiting"] += row.state.startswith("waiting")
        stage["overdue"] += row.state.startswith("overdue")
    lag = {t: s["lag"] or 0 for t, s in stages.items()}
    recovery = [
        {
            "topic": r.topic,
            "held": r.held,
            "handled": r.handled,
            "recovered": r.recovered,
            "rate": None if r.rate is None else round(r.rate, 4),
        }
        for r in tally.recovery([t.topic for t in topics.tiers], lag)
    ]
    return {
        "at": instant(now_ms),
        "stages": list(stages.values()),
        "recovery": recovery,
        "dlq_by_reason": tally.dlq_by_reason.most_common(),
        "dlq_by_type": tally.dlq_by_type.most_common(20),
        "counted": {"records": counted[0], "of": counted[1]},
        "series": [list(point) for point in tally.series(now_ms)],
    }


def chart_geometry(series: Sequence[Sequence[int]], *, width: int = 720, height: int = 200) -> dict[str, Any]:
    """Polyline points (SVG user units) of failures, retries and dead letters per time bucket, with the y
    axis' top value and the first and last bucket's times; numbers only, nothing from a record."""
    top = max([1, *(max(point[1:]) for point in series)])
    step = width / max(1, len(series) - 1)

    def line(column: int) -> str:
        return " ".join(f"{i * step:.1f},{height - point[column] * height / top:.1f}" for i, point in enumerate(series))

    return {
        "width": width,
        "height": height,
        "top": top,
        "failures": line(1),
        "retries": line(2),
        "dead": line(3),
        "first": instant(series[0][0]) if series else "",
        "last": instant(series[-1][0]) if series else "",
    }


def lineage_hops(entries: Iterable[Entry], topics: TopicSet) -> list[dict[str, Any]]:
    """Every record of one origin id across the tiers, the DLQ and replays, in time order: its stage, the
    attempt, tier, exception, due time, and when it was handled (the next hop's time, if there is one)."""
    kinds = {t.topic: f"tier {i + 1}" for i, t in enumerate(topics.tiers)}
    kinds.update({topics.dlq: "DLQ", topics.source: "source"})
    ordered = sorted(entries, key=lambda e: (e.timestamp_ms, e.topic, e.partition, e.offset))
    hops = []
    for i, entry in enumerate(ordered):
        retry = entry.retry
        hops.append(
            {
                "stage": kinds.get(entry.topic, entry.topic) + (" (replayed)" if entry.lineage.replay_id else ""),
                "topic": entry.topic,
                "coordinates": entry.coordinates,
                "time": instant(entry.timestamp_ms),
                "attempt": retry.reconsume_times if retry else None,
                "tier": retry.tier if retry else None,
                "due": instant(retry.due_at) if retry else "",
                "exception": f"{retry.exception_type}: {redact(retry.exception_message)}" if retry else None,
                "reason": retry.dlq_reason.value if retry and retry.dlq_reason else None,
                "replay_id": entry.lineage.replay_id,
                "handled": instant(ordered[i + 1].timestamp_ms) if i + 1 < len(ordered) else "",
            }
        )
    return hops
