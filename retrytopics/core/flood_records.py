"""The records of a guarded handler's compacted flood-guard topic (docs/flood-guard.md, "Seen and steered from
outside") and their wire form:

- `GuardReport`, key ``report/<handler>/<process>``: what one process's guard of the handler says of itself
  (state, openings, probes, calls refused, time open), written on each change of state and every half minute;
  `ProcessLeft` is its tombstone, written when the process stops cleanly;
- `GuardCommand`, key ``command/<handler>``: an operator's order to open or close the handler's guard by hand
  (`retrytopics guard`), read by every process running the handler.

Every byte read is untrusted: `decode_guard_record` checks each field's type and bound and refuses anything
else (the reason is a `GuardRecordError`, which never quotes more than a short excerpt). With header keys,
every record, tombstones included, is signed (`encode_guard_record`) and a reader verifies it first
(`core.signing.verify_guard`, a domain of its own). Compaction keeps the latest record per key: a process
starting late still reads the last command given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, TypeAlias

from retrytopics.core.flood_guard import GuardState
from retrytopics.core.headers import Header
from retrytopics.core.signing import HeaderKeys, sign_guard

__all__ = [
    "GuardAction",
    "GuardBoardView",
    "GuardCommand",
    "GuardRecord",
    "GuardRecordError",
    "GuardReport",
    "ProcessLeft",
    "decode_guard_record",
    "encode_guard_record",
    "board_view",
]

_VERSION: Final = 1
_MAX_KEY_BYTES: Final = 512
_MAX_VALUE_BYTES: Final = 2048
_MAX_TEXT: Final = 200
_MAX_INT: Final = 2**63 - 1
_HANDLER: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
_PROCESS: Final = re.compile(r"[A-Za-z0-9._:@-]{1,100}")


class GuardRecordError(ValueError):
    """A flood-guard record that does not decode: the reason, never more than a short excerpt of the bytes."""


class GuardAction(StrEnum):
    OPEN = "open"
    """Open the guard and keep it open (no probe) until closed by hand."""
    CLOSE = "close"
    """Close the guard (calls ramp up), whether it was opened by hand or by failures."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardCommand:
    """An operator's order to the guards of `handler` in every process. `at_ms` is the operator's wall clock:
    a guard applies a command only if it is later than the last it applied, so a copy of an old one written
    again (a replay) changes nothing."""

    handler: str
    action: GuardAction
    reason: str
    by: str
    at_ms: int

    def __post_init__(self) -> None:
        _check_handler(self.handler)
        _check_text("reason", self.reason)
        _check_text("by", self.by)
        _check_int("at_ms", self.at_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardReport:
    """One process's guard of `handler`, as it reported itself at `at_ms` (wall clock): its `state`, whether
    it was opened by hand (`forced`), the `reason` of its last change at `changed_at_ms`; and since the process
    started: `openings`, `probes` made, calls `refused` (the attempts an outage did not burn), records
    `deferred` (not dead-lettered), and `open_ms`, the time it was not closed."""

    handler: str
    process: str
    state: GuardState
    forced: bool
    reason: str
    at_ms: int
    changed_at_ms: int
    openings: int
    probes: int
    refused: int
    deferred: int
    open_ms: int

    def __post_init__(self) -> None:
        _check_handler(self.handler)
        _check_process(self.process)
        _check_text("reason", self.reason)
        for name in ("at_ms", "changed_at_ms", "openings", "probes", "refused", "deferred", "open_ms"):
            _check_int(name, getattr(self, name))


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessLeft:
    """The tombstone of a process's report: it stopped cleanly."""

    handler: str
    process: str


GuardRecord: TypeAlias = GuardCommand | GuardReport | ProcessLeft


def _key(record: GuardRecord) -> bytes:
    if isinstance(record, GuardCommand):
        return f"command/{record.handler}".encode("ascii")
    return f"report/{record.handler}/{record.process}".encode("ascii")


def _value(record: GuardRecord) -> bytes | None:
    if isinstance(record, ProcessLeft):
        return None
    if isinstance(record, GuardCommand):
        body: dict[str, object] = {"action": str(record.action), "reason": record.reason, "by": record.by}
        body["at_ms"] = record.at_ms
    else:
        body = {
            "state": str(record.state),
            "forced": record.forced,
            "reason": record.reason,
            "at_ms": record.at_ms,
            "changed_at_ms": record.changed_at_ms,
            "openings": record.openings,
            "probes": record.probes,
            "refused": record.refused,
            "deferred": record.deferred,
            "open_ms": record.open_ms,
        }
    return json.dumps({"v": _VERSION, **body}, separators=(",", ":"), sort_keys=True).encode("utf-8")


def encode_guard_record(
    record: GuardRecord, topic: str, keys: HeaderKeys | None
) -> tuple[bytes, bytes | None, list[Header]]:
    """The key, value (None: a tombstone) and headers of `record` on `topic`; signed when `keys` are given."""
    key, value = _key(record), _value(record)
    return key, value, ([] if keys is None else [sign_guard(keys, topic, key, value)])


def decode_guard_record(key: bytes | None, value: bytes | None) -> GuardRecord:
    """The record a flood-guard topic's `key` and `value` say, or a `GuardRecordError` (see the module
    docstring)."""
    if key is None or len(key) > _MAX_KEY_BYTES:
        raise GuardRecordError("the key is missing or too long")
    try:
        kind, _, rest = key.decode("ascii").partition("/")
    except UnicodeDecodeError:
        raise GuardRecordError("the key is not ASCII") from None
    if kind == "command":
        body = _body(value, {"action", "reason", "by", "at_ms"})
        action = body["action"]
        if action not in {a.value for a in GuardAction}:
            raise GuardRecordError("the action is neither open nor close")
        return _built(
            lambda: GuardCommand(
                handler=rest,
                action=GuardAction(action),
                reason=_str(body, "reason"),
                by=_str(body, "by"),
                at_ms=_int(body, "at_ms"),
            )
        )
    if kind == "report":
        handler, _, process = rest.rpartition("/")
        if value is None:
            return _built(lambda: ProcessLeft(handler=_checked_handler(handler), process=_checked_process(process)))
        names = {"state", "forced", "reason", "at_ms", "changed_at_ms", "openings", "probes", "refused"}
        body = _body(value, names | {"deferred", "open_ms"})
        state, forced = body["state"], body["forced"]
        if not isinstance(state, str) or state not in {s.value for s in GuardState} or not isinstance(forced, bool):
            raise GuardRecordError("the state or forced field is not one a guard writes")
        counts = {n: _int(body, n) for n in ("openings", "probes", "refused", "deferred", "open_ms")}
        return _built(
            lambda: GuardReport(
                handler=handler,
                process=process,
                state=GuardState(state),
                forced=forced,
                reason=_str(body, "reason"),
                at_ms=_int(body, "at_ms"),
                changed_at_ms=_int(body, "changed_at_ms"),
                **counts,
            )
        )
    raise GuardRecordError("the key is neither command/... nor report/...")


def _body(value: bytes | None, names: set[str]) -> dict[str, object]:
    if value is None or len(value) > _MAX_VALUE_BYTES:
        raise GuardRecordError("the value is missing or too long")
    try:
        body = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deep to read
        raise GuardRecordError("the value is not JSON") from None
    if not isinstance(body, dict) or body.get("v") != _VERSION or set(body) != names | {"v"}:
        raise GuardRecordError(f"the value is not a version {_VERSION} record with exactly its fields")
    return body


def _built(make: Callable[[], GuardRecord]) -> GuardRecord:
    try:
        return make()
    except ValueError as exc:  # a field out of its bounds (a GuardRecordError itself, or the enum's)
        raise GuardRecordError(str(exc)) from None


def _str(body: dict[str, object], name: str) -> str:
    value = body[name]
    if not isinstance(value, str):
        raise GuardRecordError(f"{name} is not text")
    return value


def _int(body: dict[str, object], name: str) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise GuardRecordError(f"{name} is not an integer")
    return value


def _check_handler(handler: str) -> None:
    _checked_handler(handler)


def _checked_handler(handler: str) -> str:
    if not _HANDLER.fullmatch(handler) or handler in {".", ".."}:
        raise GuardRecordError("the handler is not a legal topic name")
    return handler


def _check_process(process: str) -> None:
    _checked_process(process)


def _checked_process(process: str) -> str:
    if not _PROCESS.fullmatch(process):
        raise GuardRecordError("the process name is not 1-100 of A-Z a-z 0-9 . _ : @ -")
    return process


def _check_text(name: str, text: str) -> None:
    # printable and short: it is logged and shown as it is
    if not isinstance(text, str) or len(text) > _MAX_TEXT or not text.isprintable():
        raise GuardRecordError(f"{name} is not printable text of at most {_MAX_TEXT} characters")


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT:
        raise GuardRecordError(f"{name} is not an integer in 0..2**63-1")


@dataclass(frozen=True, slots=True)
class GuardBoardView:
    """What a flood-guard topic says now, by compaction's rule: the latest command per handler (by `at_ms`,
    as the guards apply them) and the latest report of each process per handler (a process that left is
    gone)."""

    commands: dict[str, GuardCommand] = field(default_factory=dict)
    reports: dict[tuple[str, str], GuardReport] = field(default_factory=dict)

    def for_handler(self, handler: str) -> tuple[GuardCommand | None, list[GuardReport]]:
        reports = [r for (h, _), r in sorted(self.reports.items()) if h == handler]
        return self.commands.get(handler), reports


def board_view(records: Iterable[GuardRecord]) -> GuardBoardView:
    """The view of `records` read in log order (see `GuardBoardView`)."""
    view = GuardBoardView()
    for record in records:
        if isinstance(record, GuardCommand):
            last = view.commands.get(record.handler)
            if last is None or record.at_ms > last.at_ms:
                view.commands[record.handler] = record
        elif isinstance(record, GuardReport):
            view.reports[record.handler, record.process] = record
        else:
            view.reports.pop((record.handler, record.process), None)
    return view
