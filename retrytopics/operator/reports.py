"""Text for people at a terminal: aligned tables, durations and counts, and the replay job's result.

Commands print these by default and JSON with `--json`, so nothing here needs to be parsed back.

    >>> print(table(["stage", "records"], [["orders", 2000], ["orders.billing.dlq", 12]]))
    stage               records
    orders                 2000
    orders.billing.dlq       12

Pure: standard library only. A cell is text, a number or None (printed "-"); numeric columns align right.
Text from records (keys, ids, exception text) is untrusted: every text output goes through `safe_text`, so
no control character (ESC, BEL, a newline, a bidi override) reaches the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["cell", "counts", "duration", "key_state_text", "key_values", "replay_text", "safe_text", "table"]

Cell = str | int | float | bool | None

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(text: str, limit: int | None = None) -> str:
    """`text` fit for a terminal: every character that is not printable (control characters such as ESC
    and BEL, line breaks, format characters such as bidi overrides) written as its escape (`\\x1b`), then
    cut to at most `limit` characters, ending in "…" when cut (never inside an escape). A space stays."""
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    pieces = [char if char.isprintable() else _escape(char) for char in text]
    if limit is None or sum(map(len, pieces)) <= limit:
        return "".join(pieces)
    kept: list[str] = []
    room = limit - 1  # for the "…"
    for piece in pieces:
        if len(piece) > room:
            break
        kept.append(piece)
        room -= len(piece)
    return "".join(kept) + "…"


def cell(value: Cell) -> str:
    """One value as people read it: None is "-", booleans are yes/no, floats have at most 4 digits, text
    through `safe_text`."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return safe_text(str(value))


def _numeric(values: Iterable[Cell]) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], *, align: str = "", indent: str = "") -> str:
    """Rows under `headers`, columns padded to their widest cell. `align` has one letter per column, `l` or
    `r` (`"llrr"`); by default a column of numbers aligns right and any other left."""
    data = [list(row) for row in rows]
    for row in data:
        if len(row) != len(headers):
            raise ValueError(f"a row has {len(row)} cells for {len(headers)} columns: {row}")
    if align and (len(align) != len(headers) or set(align) - {"l", "r"}):
        raise ValueError(f"align={align!r}: one of l or r per column ({len(headers)})")
    columns = list(zip(*data, strict=True)) if data else [() for _ in headers]
    right = [a == "r" for a in align] if align else [_numeric(column) for column in columns]
    text = [[cell(v) for v in row] for row in data]
    widths = [max([len(h), *(len(row[i]) for row in text)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return (indent + "  ".join(padded)).rstrip()

    return "\n".join([line(headers), *(line(row) for row in text)])


def key_values(pairs: Iterable[tuple[str, Cell]], *, indent: str = "") -> str:
    """`label  value` lines with the values in one column (aligned right when they are all numbers)."""
    items = list(pairs)
    return table(["", ""], [[label, value] for label, value in items], indent=indent).partition("\n")[2]


def duration(ms: float | None) -> str:
    """Milliseconds as `850ms`, `12.3s`, `4m05s` or `2h10m`; None is "-"."""
    if ms is None:
        return "-"
    if abs(ms) < 1000:
        return f"{ms:.0f}ms"
    seconds = ms / 1000
    if abs(seconds) < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def counts(mapping: Mapping[str, int], *, unknown: str = "unknown") -> str:
    """`{"exhausted": 10, "poison": 2}` as `exhausted 10, poison 2` ("none" when empty); a key that stands
    for a missing value ("None") reads as `unknown`."""
    if not mapping:
        return "none"
    return ", ".join(
        f"{unknown if key in ('None', '') else safe_text(key, _NAME_LIMIT)} {n}" for key, n in mapping.items()
    )


#: The longest a name from a record (an exception type, an origin id) is printed in a line or a sample cell.
_NAME_LIMIT = 60

#: The skip counters of a replay result, in the order an operator reads them.
_SKIPPED = (
    ("skipped_foreign", "not from this pipeline"),
    ("skipped_invalid", "invalid headers"),
    ("skipped_duplicates", "older copy of a source record"),
    ("skipped_reference_only", "too large: only a reference to the value"),
    ("skipped_headers_dropped", "too many headers: dead-lettered without its user headers"),
    ("skipped_max_replays", "replayed too often"),
    ("skipped_already_replayed", "written by an earlier run of this id"),
)


def replay_text(result: Mapping[str, Any]) -> str:
    """The console view of a replay result (`retrytopics.spark.replay.replay`): what was selected, written
    or skipped and why, then the dry run's sample as a table."""
    dry = bool(result.get("dry_run"))
    written = "nothing written (dry run)" if dry else f"{result.get('written', 0)} written"
    destinations = ", ".join(result.get("destination_topics") or []) or "none"
    lines = [
        f"replay {result.get('replay_id')} to the {str(result.get('destination', '')).replace('_', ' ')} "
        f"topic: {written}",
        "",
    ]
    pairs: list[tuple[str, Cell]] = [("selected (match the filters)", result.get("selected", 0))]
    for key, label in _SKIPPED:
        if key in result and not (dry and key == "skipped_already_replayed"):
            pairs.append((f"skipped: {label}", result[key]))
    pairs.append(("parked", result.get("parked", 0)))
    if dry:  # every selected record not skipped is written (the parked ones to <dlq>.parked)
        skipped = sum(int(result.get(key) or 0) for key, _ in _SKIPPED)
        pairs.append(("would write", int(result.get("selected") or 0) - skipped))
    else:
        pairs.append(("written", result.get("written", 0)))
    lines.append(key_values(pairs))
    problems = result.get("skipped_invalid_by_problem") or {}
    if problems:
        lines.append(f"invalid by problem: {counts(problems)}")
    lines.append(f"destination topics: {destinations}")
    broker = result.get("broker_dlq")
    if broker:  # not among the selected: the broker's own DLQ, never replayed (its records lost their headers)
        lines.append(
            f"broker DLQ {broker['topic']}: {result.get('skipped_broker_dlq', 0)} not replayed (no headers "
            f"copied), by reason: {counts(broker['by_reason'])}"
        )
    sample = result.get("sample") or []
    if sample:
        headers = list(sample[0])
        lines += [
            "",
            f"sample ({len(sample)} of {result.get('selected', len(sample))} selected):",
            table(headers, [[_short(row.get(h)) for h in headers] for row in sample], indent="  "),
        ]
    return "\n".join(lines)


#: The open chains `topics describe` lists (oldest first per partition); `--json` gives them all.
CHAINS_SHOWN = 20


def key_state_text(view: Mapping[str, Any]) -> str:
    """`topics describe`'s view of a key-state topic (`ops.KeyStateView.as_dict()`): how many keys are
    blocked, how many records were skipped as malformed or forged, and the first `CHAINS_SHOWN` open chains, each
    by its key id in hex (never the key's bytes)."""
    chains = view["chains"]
    malformed = f", {view['malformed']} malformed records skipped" if view["malformed"] else ""
    if view.get("forged"):
        malformed += f", {view['forged']} unsigned or forged records skipped"
    lines = [f"key-state topic {safe_text(view['topic'])}: {len(chains)} blocked keys{malformed}"]
    if chains:
        columns = ["partition", "key id", "head", "frontier", "tier", "followers", "since"]
        rows = [
            [
                c["partition"],
                c["key_id"],
                c["head"],
                c["frontier"],
                c["at_tier"],
                c["followers"],
                _instant(c["since_ms"]),
            ]
            for c in chains[:CHAINS_SHOWN]
        ]
        lines.append(table(columns, rows, align="rlrrrrl"))
    if len(chains) > CHAINS_SHOWN:
        lines.append(f"... and {len(chains) - CHAINS_SHOWN} more (--json lists them all)")
    return "\n".join(lines)


def _instant(ms: int) -> str:
    return "unknown" if ms < 0 else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _short(value: Cell) -> Cell:
    return safe_text(value, _NAME_LIMIT) if isinstance(value, str) else value
