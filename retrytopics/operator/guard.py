"""The operator's side of the retry-flood guard (docs/flood-guard.md, "Seen and steered from outside"): a command
to open or close a guarded handler's guard in every process of the app (`retrytopics guard open|close`), and
what its flood-guard topic says of each process's guard (`retrytopics topics describe`).

Both act on the compacted flood-guard topic the app provisions (`TopicSet.flood_guard_topic`); each process
running the handler reads the commands there (runtime/flood/board.py). With header keys the command is signed
and only signed reports are shown; every record read is untrusted and decoded by `core.flood_records`.
"""

from __future__ import annotations

import getpass
import re
import socket
import time
from dataclasses import dataclass

from retrytopics.connectors.admin import partition_count
from retrytopics.connectors.clients import read_to_end
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.core.errors import ConfigError, KafkaClientError
from retrytopics.core.flood_records import (
    GuardAction,
    GuardCommand,
    GuardRecord,
    GuardRecordError,
    GuardReport,
    board_view,
    decode_guard_record,
    encode_guard_record,
)
from retrytopics.core.signing import verify_guard
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import pipeline_topics

__all__ = ["FloodGuardView", "describe_flood_guard", "operator_name", "send_guard_command"]


def operator_name() -> str:
    """Who gives a command, as it is logged by every process: `user@host`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return re.sub(r"[^A-Za-z0-9._@-]", "_", f"{user}@{socket.gethostname()}")[:100]


def _existing_topic(kafka: KafkaConfig, app: AppSettings) -> str:
    name = pipeline_topics(app).flood_guard_topic
    if partition_count(make_admin(kafka), name) is None:
        raise ConfigError(
            "app.flood_guard",
            name,
            "the flood-guard topic does not exist: the handler has no guard, or run `retrytopics topics create` "
            "with flood_guard = true (or app.provision())",
        )
    return name


def send_guard_command(
    kafka: KafkaConfig, app: AppSettings, action: GuardAction, *, reason: str, by: str, timeout_s: float = 30.0
) -> GuardCommand:
    """Write the command to open or close the guard of the pipeline's handler; each of its processes applies
    it (a process started later applies the last one given). Signed with the pipeline's header keys, if any."""
    assert app.topic is not None
    topic = _existing_topic(kafka, app)
    try:
        command = GuardCommand(handler=app.topic, action=action, reason=reason, by=by, at_ms=int(time.time() * 1000))
    except GuardRecordError as exc:
        raise ConfigError("--reason", reason, str(exc)) from None
    key, value, headers = encode_guard_record(command, topic, app.header_keys)
    producer = make_producer(kafka)
    failures: list[str] = []

    def delivered(error: object, _msg: object) -> None:
        if error is not None:
            failures.append(str(error))

    signed: list[tuple[str, str | bytes | None]] = list(headers)
    producer.produce(topic, key=key, value=value, headers=signed, partition=0, on_delivery=delivered)
    if producer.flush(timeout_s) or failures:
        raise KafkaClientError(f"the command was not written to {topic}: {failures or 'not acknowledged in time'}")
    return command


@dataclass(frozen=True, slots=True)
class FloodGuardView:
    """What the flood-guard topic says of the handler: the last command given and each process's last report;
    `untrusted`: records skipped (malformed, or unsigned/forged with header keys)."""

    topic: str
    command: GuardCommand | None
    reports: tuple[GuardReport, ...]
    untrusted: int

    def as_dict(self, now_ms: int) -> dict[str, object]:
        command = self.command
        return {
            "topic": self.topic,
            "last_command": None
            if command is None
            else {"action": str(command.action), "reason": command.reason, "by": command.by, "at_ms": command.at_ms},
            "processes": [
                {
                    "process": r.process,
                    "state": str(r.state),
                    "by_hand": r.forced,
                    "reason": r.reason,
                    "since_ms": r.changed_at_ms,
                    "openings": r.openings,
                    "probes": r.probes,
                    "calls_refused": r.refused,
                    "deferred": r.deferred,
                    "time_open_ms": r.open_ms,
                    "reported_ms_ago": max(0, now_ms - r.at_ms),
                }
                for r in self.reports
            ],
            "untrusted_records": self.untrusted,
        }


def describe_flood_guard(kafka: KafkaConfig, app: AppSettings, *, timeout_s: float = 30.0) -> FloodGuardView | None:
    """The flood-guard topic of the pipeline's handler read to its end now; None when it has none (no guard)."""
    assert app.topic is not None
    name = pipeline_topics(app).flood_guard_topic
    if partition_count(make_admin(kafka), name) is None:
        return None
    records: list[GuardRecord] = []
    untrusted = 0
    for msg in read_to_end(kafka, name, None, timeout_s=timeout_s):
        if app.header_keys is not None and verify_guard(app.header_keys, name, msg.key, msg.value, msg.headers):
            untrusted += 1
            continue
        try:
            records.append(decode_guard_record(msg.key, msg.value))
        except GuardRecordError:
            untrusted += 1
    command, reports = board_view(records).for_handler(app.topic)
    return FloodGuardView(topic=name, command=command, reports=tuple(reports), untrusted=untrusted)


def flood_guard_text(view: dict[str, object]) -> str:
    """`topics describe`'s flood-guard section, from `FloodGuardView.as_dict`."""
    lines = [f"flood guard ({view['topic']}):"]
    command = view["last_command"]
    if isinstance(command, dict):
        lines.append(f"  last command: {command['action']} by {command['by']}: {command['reason']}")
    processes = view["processes"]
    assert isinstance(processes, list)
    if not processes:
        lines.append("  no process reports a guard (none running, or none reported yet)")
    for p in processes:
        hand = " (by hand)" if p["by_hand"] else ""
        lines.append(
            f"  {p['process']}: {p['state']}{hand}, {p['reason']}; openings {p['openings']}, probes {p['probes']}, "
            f"calls refused {p['calls_refused']}, deferred {p['deferred']}, time open {p['time_open_ms'] / 1000:.1f}s "
            f"(reported {p['reported_ms_ago'] / 1000:.0f}s ago)"
        )
    if view["untrusted_records"]:
        lines.append(f"  {view['untrusted_records']} record(s) skipped: malformed, or unsigned/forged")
    return "\n".join(lines)
