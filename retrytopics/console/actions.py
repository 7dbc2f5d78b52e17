"""Replay from the console: a selection of DLQ records (checked on the page) republished to the original
topic or the first tier, with the rules of `retrytopics replay` (`retrytopics.spark.replay`) for selections
small enough to need no Spark:

- a destination is never taken from the page: the record's own original topic, which must be this
  pipeline's source, or the pipeline's first tier; other records are skipped as foreign;
- a record whose retry headers do not decode as a DLQ record, name a source partition that does not exist,
  or (with header keys) carry no valid signature is skipped, with its problem;
- written in source order (original topic, partition, offset), not DLQ order; to the first tier, a
  key-ordered handler's dead-lettered sequence (`blocked_by_key` records and the records they waited behind,
  as far as the selection shows them) is refused;
- one record per source record (its original topic, partition and offset), the latest episode; one whose
  value is only a reference to a too-large record, or that lost its user headers (`too_many_headers`), is
  skipped (`skipped_reference_only`, `skipped_headers_dropped`): its content is not the record's;
- records replayed `max_replays` times are skipped, or parked in `<dlq>.parked`;
- idempotent per DLQ record across selections: a replay's `started` ledger entry lists the source records it
  is about to write, and a source record listed by another console replay is skipped
  (`skipped_replayed_before`, naming that replay id) whatever else is selected: the DLQ record itself never
  changes (its replay count stays what it was), so without this a second, overlapping selection would write
  it again;
- idempotent per replay id through the replay ledger (`retrytopics.spark.ledger`): the first run records the
  destinations' high watermarks and a random nonce before writing, and marks each record it writes
  (`retry.replay_mark`, keyed by the nonce); a rerun skips what that id wrote since, counting only records
  whose mark verifies (a replay id started without a nonce trusts its markers, as the Spark replay does);
- the same output headers (user headers byte for byte, the replay lineage, and to a tier the retry state
  reset), signed for the first tier when the app signs its retry headers.

`plan_replay` and `replay_headers` are pure; `run_replay` reads, writes and records.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_producer, map_kafka_errors
from retrytopics.connectors.ranges import partition_bounds, range_reader, read_range
from retrytopics.connectors.record_headers import read_headers
from retrytopics.console.entries import Entry
from retrytopics.console.filters import DlqFilter
from retrytopics.core.errors import ConfigError, PublishError
from retrytopics.core.headers import (
    REPLAY_COUNT,
    REPLAY_ID,
    REPLAY_ORIGIN_ID,
    REPLAYED_AT,
    DlqReason,
    Header,
    Lineage,
    encode,
    user_headers,
)
from retrytopics.core.keyorder.hops import waited_behind
from retrytopics.core.naming import TopicSet
from retrytopics.core.signing import HeaderKeys, mark_keys, mark_verifies, replay_mark, sign, started_mark_keys, verify

__all__ = [
    "DESTINATIONS",
    "MAX_SELECTION",
    "ReplayPlan",
    "ReplayRequest",
    "plan_replay",
    "replay_headers",
    "console_replays",
    "replay_id_for",
    "run_replay",
    "spark_replay_command",
]

#: Where a replay may write (as `retrytopics replay --to`).
DESTINATIONS: Final = ("original", "first_tier")
#: Records one console replay may select; more go to `retrytopics replay` (Spark).
MAX_SELECTION: Final = 1000
#: The replay ledger's lineage header (`retrytopics.spark.ledger.REPLAY_ORIGINAL`), named here so that the
#: pure plan needs no Spark import; a unit test holds the two equal.
REPLAY_ORIGINAL: Final = "retry.replay_original"
#: The ledger's mark header (`retrytopics.spark.ledger.REPLAY_MARK`), held equal by the same unit test.
REPLAY_MARK: Final = "retry.replay_mark"
_INT32: Final = 2**31 - 1
#: Console replays that write run one at a time: each reads the ledger's listed records, then lists its own,
#: so two overlapping selections cannot both find a record unlisted.
_WRITING: Final = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRequest:
    """What the operator asked for: DLQ coordinates (partition, offset), a destination and the guards."""

    replay_id: str
    destination: str = "original"
    coordinates: tuple[tuple[int, int], ...]
    max_replays: int = 1
    allow_replayed: bool = False
    park: bool = False

    def __post_init__(self) -> None:
        Lineage(replay_id=self.replay_id)  # validated like the header it becomes
        if self.destination not in DESTINATIONS:
            raise ConfigError("destination", self.destination, f"expected one of {DESTINATIONS}")
        if not 0 < len(self.coordinates) <= MAX_SELECTION:
            raise ConfigError(
                "records",
                len(self.coordinates),
                f"select 1 to {MAX_SELECTION} records (larger selections: retrytopics replay, with Spark)",
            )
        if self.max_replays < 0:
            raise ConfigError("max_replays", self.max_replays, "must be >= 0")


def replay_id_for(destination: str, coordinates: Sequence[tuple[int, int]]) -> str:
    """A replay id naming this exact selection: choosing the same records again reuses it, so a second
    replay of them writes nothing."""
    text = destination + ";" + ",".join(f"{p}:{o}" for p, o in sorted(set(coordinates)))
    return "console-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def spark_replay_command(chosen: DlqFilter, *, pipeline: Sequence[str], destination: str) -> str:
    """The `retrytopics replay` command (Spark) for a filter too large for the console: the same selection,
    as far as the Spark replay's flags express it (an origin id goes in a file; a key or header filter becomes
    a `--where` over the typed columns: the command says so)."""
    args = ["retrytopics", "replay", *pipeline, "--replay-id", "REPLAY_ID", "--to", destination, "--dry-run"]
    for reason in sorted(chosen.reasons):
        args += ["--reason", reason]
    for kind in sorted(chosen.exception_types):
        args += ["--exception-type", kind]
    if chosen.since_ms is not None:
        args += ["--since", str(chosen.since_ms)]
    if chosen.until_ms is not None:
        args += ["--until", str(chosen.until_ms)]
    command = " ".join(shlex.quote(a) for a in args)
    if chosen.origin_id is not None:
        command += " --origin-ids FILE  # FILE: the origin id, one line"
    if chosen.key is not None or chosen.header is not None:
        command += "  # plus the key or header filter, as --where over the typed columns (docs/spark.md)"
    return command


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayPlan:
    """Each record to write with its destination topic, the counts of what was skipped, and the problem of
    each invalid record (by DLQ coordinates)."""

    writes: tuple[tuple[Entry, str], ...]
    counts: dict[str, int] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    #: DLQ coordinates → the other console replay that already lists the record's source record
    replayed_before: dict[str, str] = field(default_factory=dict)


def _problem(entry: Entry, source_partitions: int, header_keys: HeaderKeys | None) -> str | None:
    if header_keys is not None:  # first: a record that fails it may have been forged to pass the rest
        if verify(header_keys, entry.topic, entry.key, entry.value, list(entry.headers)) is not None:
            return "signature"
    retry = entry.retry
    if retry is None:
        return "headers"
    if retry.tier is not None:
        return "tier"
    if retry.dlq_reason is None:
        return "dlq_reason"
    if retry.original_partition >= source_partitions:
        return "original_partition"
    if entry.lineage.replay_count >= _INT32:
        return "replay_count"
    return None


def plan_replay(
    entries: Sequence[Entry],
    *,
    topics: TopicSet,
    request: ReplayRequest,
    source_partitions: int,
    header_keys: HeaderKeys | None = None,
    replayed: Mapping[str, str] | None = None,
) -> ReplayPlan:
    """Which of `entries` (DLQ records) to write where, by the rules in the module docstring. `replayed`:
    source record → the console replay id that listed it (`console_replays`); a record listed by another id
    than this request's is skipped."""
    counts = dict.fromkeys(
        (
            "selected",
            "skipped_foreign",
            "skipped_invalid",
            "skipped_duplicates",
            "skipped_reference_only",
            "skipped_headers_dropped",
            "skipped_max_replays",
            "skipped_replayed_before",
            "parked",
        ),
        0,
    )
    counts["selected"] = len(entries)
    problems: dict[str, str] = {}
    usable: dict[str, Entry] = {}
    for entry in entries:
        if entry.retry is not None and entry.retry.original_topic != topics.source:
            counts["skipped_foreign"] += 1
            continue
        problem = _problem(entry, source_partitions, header_keys)
        if problem is not None:
            counts["skipped_invalid"] += 1
            problems[entry.coordinates] = problem
            continue
        source_record = entry.source_record
        assert source_record is not None  # decoded: it has its original coordinates
        kept = usable.get(source_record)
        if kept is None or _episode(entry) > _episode(kept):
            usable[source_record] = entry
        counts["skipped_duplicates"] += 1  # one of the two; the kept one is taken back below
    counts["skipped_duplicates"] -= len(usable)
    if request.destination == "first_tier":
        _refuse_key_ordered_sequences(usable.values())
    target = topics.source if request.destination == "original" else topics.tiers[0].topic
    writes = []
    replayed_before: dict[str, str] = {}
    for entry in sorted(usable.values(), key=_source_order):
        earlier = (replayed or {}).get(entry.source_record or "")
        if earlier is not None and earlier != request.replay_id:
            counts["skipped_replayed_before"] += 1
            replayed_before[entry.coordinates] = earlier
            continue
        incomplete = _incomplete(entry)
        if incomplete is not None:
            counts[incomplete] += 1
            continue
        if entry.lineage.replay_count >= request.max_replays and not request.allow_replayed:
            if not request.park:
                counts["skipped_max_replays"] += 1
                continue
            counts["parked"] += 1
            writes.append((entry, f"{topics.dlq}.parked"))
        else:
            writes.append((entry, target))
    return ReplayPlan(writes=tuple(writes), counts=counts, problems=problems, replayed_before=replayed_before)


def _source_order(entry: Entry) -> tuple[str, int, int]:
    """Records go back in the order they first came (as the Spark replay writes them), not in DLQ order: a
    key-ordered handler's dead-lettered record and the `blocked_by_key` records behind it stay in sequence."""
    retry = entry.retry
    assert retry is not None  # a usable entry decoded as a DLQ record
    return retry.original_topic, retry.original_partition, retry.original_offset


def _refuse_key_ordered_sequences(entries: Iterable[Entry]) -> None:
    """Refuse a replay to the first tier of a key-ordered handler's dead-lettered sequence (`blocked_by_key`
    records, and the records they name as waited behind): a tier would handle them as independent retries, in
    any order. The console sees the selection only: a head selected without its followers is not recognised
    (the Spark replay reads the whole DLQ for it)."""
    entries = list(entries)
    named = {behind for e in entries if e.retry is not None and (behind := waited_behind(e.retry)) is not None}
    refused = sorted(
        e.coordinates
        for e in entries
        if e.retry is not None and (e.retry.dlq_reason == DlqReason.BLOCKED_BY_KEY or e.source_record in named)
    )
    if refused:
        shown = ", ".join(refused[:5]) + (", ..." if len(refused) > 5 else "")
        raise ConfigError(
            "destination",
            "first_tier",
            f"the selection holds records of a key-ordered handler's dead-lettered sequence ({shown}), which a "
            "tier would handle as independent retries, in any order; replay them to their original topic, where "
            "the main consumer orders them again, or leave them out of the selection",
        )


def _incomplete(entry: Entry) -> str | None:
    """The skip counter of a record whose content is not the source record's (as `spark.checks`'s
    `reference_only` and `headers_dropped`), or None."""
    reason = entry.retry.dlq_reason if entry.retry is not None else None
    if reason == DlqReason.TOO_MANY_HEADERS:
        return "skipped_headers_dropped"
    if reason == DlqReason.TOO_LARGE and _is_reference(entry.value):
        return "skipped_reference_only"
    return None


def _is_reference(value: bytes | None) -> bool:
    """Whether `value` is `router.too_large_reference`'s JSON: `too_large` true and every other field."""
    try:
        parsed = json.loads(value or b"")
    except ValueError:
        return False
    return (
        isinstance(parsed, dict)
        and parsed.get("too_large") is True
        and all(parsed.get(name) is not None for name in ("topic", "partition", "offset", "value_bytes"))
    )


def _episode(entry: Entry) -> tuple[int, int, int]:
    return entry.lineage.replay_count, entry.partition, entry.offset


def replay_headers(
    entry: Entry, *, to_tier: bool, replay_id: str, now_ms: int, topic: str = "", mark_key: bytes | None = None
) -> list[Header]:
    """The headers of the replayed record: its user headers byte for byte, to a tier the retry state with
    the count and failure times reset and due now, then the replay lineage (as the Spark replay writes them),
    and with `mark_key` the `retry.replay_mark` that attributes it on `topic` to this replay."""
    retry = entry.retry
    assert retry is not None  # planned records decoded
    lineage = Lineage(
        replay_id=replay_id,
        replayed_at=now_ms,
        replay_count=entry.lineage.replay_count + 1,
        replay_origin_id=retry.origin_message_id,
    )
    original = (REPLAY_ORIGINAL, (entry.source_record or "").encode())
    marked = [original]
    if mark_key is not None:
        marked.append((REPLAY_MARK, replay_mark(mark_key, replay_id, topic, entry.source_record or "").encode()))
    user = user_headers(list(entry.headers))
    if to_tier:
        state = retry.evolve(
            tier=0,
            due_at=now_ms,
            dlq_reason=None,
            reconsume_times=1,
            first_failed_at=now_ms,
            last_failed_at=now_ms,
            lineage=lineage,
        )
        return [*user, *encode(state), *marked]
    values = (
        (REPLAY_ID, replay_id),
        (REPLAYED_AT, now_ms),
        (REPLAY_COUNT, lineage.replay_count),
        (REPLAY_ORIGIN_ID, retry.origin_message_id),
    )
    return [*user, *((name, str(value).encode()) for name, value in values), *marked]


def _written_before(
    kafka: KafkaConfig, marks: dict[str, dict[str, int]], replay_id: str, keys: tuple[bytes, ...] | None
) -> set[tuple[str, str]]:
    """(topic, source record) of every record `replay_id` wrote since its start `marks`: with mark `keys`, only
    records whose `retry.replay_mark` verifies with one of them (anyone may write the other markers)."""
    consumer = range_reader(kafka)
    done: set[tuple[str, str]] = set()
    try:
        for topic, partitions in marks.items():
            bounds = partition_bounds(consumer, topic) or {}
            for partition, start in partitions.items():
                high = bounds.get(int(partition), (0, 0))[1]
                for offset in range(int(start), high, 2000):
                    for message in read_range(consumer, topic, int(partition), offset, min(high, offset + 2000)):
                        headers = dict(read_headers(message)[0])
                        if headers.get(REPLAY_ID) != replay_id.encode():
                            continue
                        source_record = (headers.get(REPLAY_ORIGINAL) or b"").decode("utf-8", "replace")
                        if keys is None or mark_verifies(
                            keys, replay_id, topic, source_record, headers.get(REPLAY_MARK)
                        ):
                            done.add((topic, source_record))
    finally:
        consumer.close()
    return done


def console_replays(kafka: KafkaConfig, dlq: str) -> dict[str, str]:
    """Source record → the console replay id whose `started` ledger entry listed it (the first one). The
    ledger is read whole: it holds one small entry per replay run."""
    consumer = range_reader(kafka)
    listed: dict[str, str] = {}
    try:
        ledger_topic = f"{dlq}.replays"
        for partition, (low, high) in (partition_bounds(consumer, ledger_topic) or {}).items():
            for start in range(low, high, 2000):
                for message in read_range(consumer, ledger_topic, partition, start, min(high, start + 2000)):
                    for source_record, replay_id in _listed(message.value()):
                        listed.setdefault(source_record, replay_id)
    finally:
        consumer.close()
    return listed


def _listed(value: bytes | None) -> list[tuple[str, str]]:
    """(source record, replay id) of a console replay's `started` entry; nothing for any other entry."""
    try:
        entry = json.loads(value or b"")
    except ValueError:
        return []
    if not isinstance(entry, dict) or entry.get("event") != "started":
        return []
    replay_id, records = entry.get("replay_id"), entry.get("records")
    if not isinstance(replay_id, str) or not replay_id.startswith("console-") or not isinstance(records, list):
        return []
    return [(r, replay_id) for r in records if isinstance(r, str)]


def run_replay(
    kafka: KafkaConfig,
    topics: TopicSet,
    entries: Sequence[Entry],
    request: ReplayRequest,
    *,
    header_keys: HeaderKeys | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Plan the replay of `entries` (read whole) and, unless `dry_run`, write what this replay id has not
    written yet; returns the counts as `retrytopics replay --json` names them, with a sample of the plan."""
    from retrytopics.spark import ledger  # the replay ledger is shared with the Spark replay

    target = topics.source if request.destination == "original" else topics.tiers[0].topic
    partitions = ledger.partition_counts(kafka, sorted({topics.source, target}))
    for topic in sorted({topics.source, target} - set(partitions)):
        raise ConfigError("topic", topic, "does not exist: a replay writes only to existing pipeline topics")
    with _WRITING:
        return _replay(kafka, topics, entries, request, partitions, header_keys=header_keys, dry_run=dry_run)


def _replay(
    kafka: KafkaConfig,
    topics: TopicSet,
    entries: Sequence[Entry],
    request: ReplayRequest,
    partitions: dict[str, int],
    *,
    header_keys: HeaderKeys | None,
    dry_run: bool,
) -> dict[str, Any]:
    from retrytopics.spark import ledger

    target = topics.source if request.destination == "original" else topics.tiers[0].topic
    plan = plan_replay(
        entries,
        topics=topics,
        request=request,
        source_partitions=partitions[topics.source],
        header_keys=header_keys,
        replayed=console_replays(kafka, topics.dlq),
    )
    result: dict[str, Any] = {
        "replay_id": request.replay_id,
        "dry_run": dry_run,
        "destination": request.destination,
        **plan.counts,
        "to_write": len(plan.writes),
        "problems": plan.problems,
        "replayed_before": plan.replayed_before,
        "sample": [{"record": e.coordinates, "origin_id": e.origin_id, "to": t} for e, t in plan.writes[:20]],
    }
    if dry_run:
        return {**result, "written": 0, "skipped_already_replayed": None}
    started = [e for e in ledger.read_entries(kafka, topics.dlq, request.replay_id) if e.get("event") == "started"]
    done: set[tuple[str, str]] = set()
    if started:
        keys = started_mark_keys(started[0], header_keys)
        done = _written_before(kafka, started[0]["marks"], request.replay_id, keys)
    else:
        nonce = secrets.token_bytes(32)
        marks = ledger.watermarks(kafka, sorted({target, f"{topics.dlq}.parked"}))
        listed = sorted({e.source_record or "" for e, _ in plan.writes})
        ledger.append(
            kafka,
            topics.dlq,
            request.replay_id,
            {"event": "started", "marks": marks, "nonce": nonce.hex(), "records": listed},
        )
        keys = mark_keys(nonce, header_keys)
    todo = [
        (e, t)
        for e, t in plan.writes
        if (t, e.source_record or "") not in done and e.lineage.replay_id != request.replay_id
    ]
    _write(kafka, todo, request.replay_id, topics, partitions[target], header_keys, None if keys is None else keys[0])
    result.update(written=len(todo), skipped_already_replayed=len(plan.writes) - len(todo))
    ledger.append(
        kafka,
        topics.dlq,
        request.replay_id,
        {
            "event": "finished",
            **{k: v for k, v in result.items() if k not in ("sample", "problems", "replayed_before")},
        },
    )
    return result


def _write(
    kafka: KafkaConfig,
    todo: Sequence[tuple[Entry, str]],
    replay_id: str,
    topics: TopicSet,
    target_partitions: int,
    header_keys: HeaderKeys | None,
    mark_key: bytes | None,
) -> None:
    """Write in the plan's order (source order), acknowledged (acks=all, idempotent producer) before the replay
    counts as done."""
    if not todo:
        return
    now_ms = int(time.time() * 1000)
    first_tier = topics.tiers[0].topic if topics.tiers else None
    producer = make_producer(kafka)
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    with map_kafka_errors():
        for entry, topic in todo:
            to_tier = topic == first_tier
            headers = replay_headers(
                entry, to_tier=to_tier, replay_id=replay_id, now_ms=now_ms, topic=topic, mark_key=mark_key
            )
            if to_tier and header_keys is not None:  # the tier consumers refuse unsigned records
                headers = list(sign(header_keys, topic, entry.key, entry.value, headers))
            assert entry.retry is not None
            partition = entry.retry.original_partition
            if to_tier:  # keyless: the original partition modulo the tier's; keyed: by key, as the runtime does
                partition = -1 if entry.key is not None else partition % target_partitions
            elif topic != topics.source:  # parked: one partition
                partition = -1
            wire: list[tuple[str, str | bytes | None]] = list(headers)
            if partition < 0:
                producer.produce(topic, key=entry.key, value=entry.value, headers=wire, on_delivery=delivered)
            else:
                producer.produce(
                    topic, key=entry.key, value=entry.value, headers=wire, on_delivery=delivered, partition=partition
                )
            producer.poll(0)
        remaining = producer.flush(30)
    if failures or remaining:
        raise PublishError(todo[0][1], failures[0] if failures else f"{remaining} records not acknowledged in 30s")
