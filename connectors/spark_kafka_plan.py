"""Pure planning for the Spark Kafka data source: options, offset specs, ranges, limits.

Standard library only, so every rule here is unit-tested without Spark or a broker. Option names and
meanings mirror Spark's built-in `kafka` source (keys are case-insensitive)::

    >>> spec = parse_offset_spec('{"t":{"0":5,"1":-2}}', which="startingOffsets", default="earliest")
    >>> resolve_offsets(spec, [("t", 0), ("t", 1)], {("t", 0): (0, 9), ("t", 1): (3, 9)}, which="startingOffsets")
    {('t', 0): 5, ('t', 1): 3}

A requested range that lies outside the partition's log is an error by default (naming the partition, the
offset asked for and the log's bounds); with `failOnDataLoss=false` it is clamped to the log instead.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from retrytopics.connectors.config import FORBIDDEN_OVERRIDES
from retrytopics.core.durations import parse_duration
from retrytopics.core.errors import ConfigError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetRange",
    "OffsetSpec",
    "Subscription",
    "TopicPartitionKey",
    "allocate_limit",
    "bool_option",
    "client_properties",
    "delay_batch",
    "duration_option",
    "get_option",
    "int_option",
    "offsets_from_json",
    "offsets_to_json",
    "parse_offset_spec",
    "plan_ranges",
    "resolve_offsets",
    "resolve_timestamps",
    "split_ranges",
    "subscription_from_options",
    "timestamp_spec",
]

#: Offset sentinels of the JSON form, as in Spark: -2 = earliest, -1 = latest.
EARLIEST: Final = -2
LATEST: Final = -1

TopicPartitionKey: TypeAlias = tuple[str, int]
#: "earliest", "latest", or explicit offsets per topic-partition (sentinels allowed).
OffsetSpec: TypeAlias = str | dict[TopicPartitionKey, int]

#: `kafka.*` options Spark refuses, plus librdkafka properties that load code or run commands.
_REFUSED: Final = {
    "auto.offset.reset": "the source sets the reset policy itself; use startingOffsets",
    "enable.auto.commit": "the source never commits offsets to Kafka",
    "key.deserializer": "records are read as bytes; decode with the helpers in retrytopics.spark.columns",
    "value.deserializer": "records are read as bytes; decode with the helpers in retrytopics.spark.columns",
    "key.serializer": "the key column is written as bytes",
    "value.serializer": "the value column is written as bytes",
    "interceptor.classes": "a Java client property; not supported",
}


def get_option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """Case-insensitive lookup (Spark lower-cases keys; a plain dict from a test may not)."""
    wanted = name.lower()
    for key, value in options.items():
        if key.lower() == wanted:
            return value
    return default


def int_option(options: Mapping[str, str], name: str, default: int | None, *, minimum: int = 1) -> int | None:
    raw = get_option(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, raw, "expected an integer") from None
    if value < minimum:
        raise ConfigError(name, raw, f"must be at least {minimum}")
    return value


def duration_option(options: Mapping[str, str], name: str, default_ms: int) -> int:
    """A time option as Spark reads it: a bare number is milliseconds, else e.g. '500ms', '30s', '15m'."""
    raw = get_option(options, name)
    if raw is None:
        return default_ms
    text = raw.strip().lower().replace("min", "m")
    return int(text) if text.isdigit() else parse_duration(text, field=name)


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    """`true`/`false` (any case); anything else is a ConfigError naming the option."""
    raw = get_option(options, name)
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise ConfigError(name, raw, "expected true or false")
    return raw.strip().lower() == "true"


def client_properties(options: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties from the `kafka.*` options (prefix stripped). Refuses what Spark refuses and
    every property that loads code; `kafka.bootstrap.servers` is required."""
    props: dict[str, str] = {}
    for key, value in options.items():
        if not key.lower().startswith("kafka."):
            continue
        prop = key[len("kafka.") :].lower()
        if prop in FORBIDDEN_OVERRIDES:
            raise ConfigError(key, "[hidden]", "refused: this property loads code or runs commands")
        if prop in _REFUSED:
            raise ConfigError(key, value, f"not supported: {_REFUSED[prop]}")
        if prop.startswith("java.") or prop in {"sasl.jaas.config", "ssl.truststore.location"}:
            raise ConfigError(key, "[hidden]", "a Java client property; pass librdkafka's property instead")
        props[prop] = value
    if not props.get("bootstrap.servers"):
        raise ConfigError("kafka.bootstrap.servers", None, "required")
    return props


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which topic-partitions to read: exactly one of `assign`, `subscribe`, `subscribePattern`."""

    kind: str  # "assign" | "subscribe" | "subscribePattern"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartitionKey, ...] = ()

    def select(self, partitions_by_topic: Mapping[str, int]) -> list[TopicPartitionKey]:
        """The topic-partitions to read, given the cluster's topics and their partition counts."""
        if self.kind == "assign":
            for topic, partition in self.assigned:
                if partition >= partitions_by_topic.get(topic, 0):
                    raise ConfigError("assign", f"{topic}[{partition}]", "no such topic-partition")
            return sorted(self.assigned)
        if self.kind == "subscribe":
            names = [t for t in self.topics if t in partitions_by_topic]
        else:
            regex = re.compile(self.pattern or "")
            names = [t for t in partitions_by_topic if regex.fullmatch(t)]
        return sorted((t, p) for t in names for p in range(partitions_by_topic[t]))


def subscription_from_options(options: Mapping[str, str]) -> Subscription:
    """Parse `assign` (JSON `{"t":[0,1]}`), `subscribe` (comma list) or `subscribePattern` (regex)."""
    given = {k: get_option(options, k) for k in ("assign", "subscribe", "subscribePattern")}
    present = [k for k, v in given.items() if v is not None]
    if len(present) != 1:
        raise ConfigError("subscribe", present, "set exactly one of assign, subscribe, subscribePattern")
    kind, raw = present[0], str(given[present[0]])
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise ConfigError("subscribe", raw, "name at least one topic")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise ConfigError("subscribePattern", raw, f"not a regular expression: {exc}") from None
        return Subscription("subscribePattern", pattern=raw)
    try:
        data = json.loads(raw)
        assigned = tuple((str(t), int(p)) for t, ps in data.items() for p in ps)
    except (ValueError, AttributeError, TypeError):
        raise ConfigError("assign", raw, 'expected JSON such as {"topicA":[0,1]}') from None
    return Subscription("assign", assigned=assigned)


def offsets_from_json(text: str, *, field: str) -> dict[TopicPartitionKey, int]:
    """`{"t":{"0":23,"1":-2}}` → {("t", 0): 23, ("t", 1): -2}."""
    try:
        data = json.loads(text)
        return {(str(t), int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}
    except (ValueError, AttributeError, TypeError):
        raise ConfigError(field, text, 'expected "earliest", "latest" or JSON such as {"t":{"0":23}}') from None


def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> str:
    """The JSON form Spark uses in checkpoints and progress reports (sorted, stable)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(out, sort_keys=True)


def parse_offset_spec(text: str | None, *, which: str, default: str) -> OffsetSpec:
    """`earliest`, `latest` or the JSON form; -2 (earliest) is refused in an ending spec, as in Spark."""
    raw = (text if text is not None else default).strip()
    if raw.lower() in ("earliest", "latest"):
        return raw.lower()
    offsets = offsets_from_json(raw, field=which)
    for key, offset in offsets.items():
        if offset < EARLIEST or (which.startswith("ending") and offset == EARLIEST):
            raise ConfigError(which, f"{key[0]}[{key[1]}]={offset}", "not a valid offset here")
    return offsets


def timestamp_spec(options: Mapping[str, str], prefix: str) -> int | dict[TopicPartitionKey, int] | None:
    """`<prefix>Timestamp` (one value for every partition) wins over `<prefix>OffsetsByTimestamp` (JSON)."""
    single = get_option(options, f"{prefix}Timestamp")
    if single is not None:
        try:
            return int(single)
        except ValueError:
            raise ConfigError(f"{prefix}Timestamp", single, "expected epoch milliseconds") from None
    per_partition = get_option(options, f"{prefix}OffsetsByTimestamp")
    if per_partition is not None:
        return offsets_from_json(per_partition, field=f"{prefix}OffsetsByTimestamp")
    return None


def resolve_timestamps(
    spec: int | Mapping[TopicPartitionKey, int],
    tps: Sequence[TopicPartitionKey],
    answers: Mapping[TopicPartitionKey, int],
    *,
    which: str,
    strategy: str = "error",
) -> dict[TopicPartitionKey, int]:
    """Offsets from the broker's answers to "first offset with timestamp >= t" (-1: none matched).

    An ending position with no match becomes latest; a starting one is an error unless
    `startingOffsetsByTimestampStrategy=latest`, as in Spark."""
    out: dict[TopicPartitionKey, int] = {}
    for tp in tps:
        if not isinstance(spec, int) and tp not in spec:
            raise ConfigError(which, f"{tp[0]}[{tp[1]}]", "no timestamp given for this partition")
        answer = answers.get(tp, LATEST)
        if answer < 0:
            if which.startswith("starting") and strategy != "latest":
                raise ConfigError(which, f"{tp[0]}[{tp[1]}]", "no offset has a timestamp at or after the one given")
            answer = LATEST
        out[tp] = answer
    return out


def resolve_offsets(
    spec: OffsetSpec,
    tps: Sequence[TopicPartitionKey],
    watermarks: Mapping[TopicPartitionKey, tuple[int, int]],
    *,
    which: str,
) -> dict[TopicPartitionKey, int]:
    """Concrete offsets for `tps` from a spec and the (low, high) watermarks; sentinels are resolved.
    A JSON spec must name every partition read (as Spark requires)."""
    out: dict[TopicPartitionKey, int] = {}
    for tp in tps:
        low, high = watermarks[tp]
        if isinstance(spec, str):
            offset = low if spec == "earliest" else high
        elif tp not in spec:
            raise ConfigError(which, f"{tp[0]}[{tp[1]}]", "the JSON form must give an offset for every partition read")
        else:
            offset = spec[tp]
        out[tp] = low if offset == EARLIEST else high if offset == LATEST else offset
    return out


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets `[start, end)` of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def plan_ranges(
    starts: Mapping[TopicPartitionKey, int],
    ends: Mapping[TopicPartitionKey, int],
    watermarks: Mapping[TopicPartitionKey, tuple[int, int]],
    *,
    fail_on_data_loss: bool = True,
) -> list[OffsetRange]:
    """One range per topic-partition, checked against the log's bounds (see the module docstring)."""
    ranges = []
    for tp in sorted(starts):
        low, high = watermarks[tp]
        start, end = starts[tp], ends[tp]
        problem = _range_problem(start, end, low, high)
        if problem and fail_on_data_loss:
            raise ConfigError(
                "offsets",
                f"{tp[0]}[{tp[1]}] [{start}, {end})",
                f"{problem}; the log holds [{low}, {high}). Set failOnDataLoss=false to clamp to the log",
            )
        start, end = min(max(start, low), high), min(max(end, low), high)
        if start > end:
            raise ConfigError("offsets", f"{tp[0]}[{tp[1]}] [{starts[tp]}, {ends[tp]})", "start is after end")
        ranges.append(OffsetRange(tp[0], tp[1], start, end))
    return ranges


def _range_problem(start: int, end: int, low: int, high: int) -> str | None:
    if start < low:
        return "the start is before the log start (records were deleted)"
    if end > high:
        return "the end is beyond the high watermark"
    if start > end:
        return "the start is after the end"
    return None


def split_ranges(
    ranges: Iterable[OffsetRange], *, min_partitions: int | None = None, max_records: int | None = None
) -> list[OffsetRange]:
    """Split big ranges: no range above `max_records`; then, if fewer than `min_partitions` ranges remain,
    split each in proportion to its size (Spark's KafkaOffsetRangeCalculator). Empty ranges are kept:
    they cost one cheap task and keep empty partitions visible."""
    out: list[OffsetRange] = []
    for r in ranges:
        out.extend(_chunks(r, math.ceil(r.size / max_records) if max_records and r.size > max_records else 1))
    if min_partitions is None or len(out) >= min_partitions:
        return out
    total = sum(r.size for r in out)
    if total == 0:
        return out
    result: list[OffsetRange] = []
    for r in out:
        result.extend(_chunks(r, max(1, round(r.size / total * min_partitions))) if r.size else [r])
    return result


def _chunks(r: OffsetRange, parts: int) -> list[OffsetRange]:
    parts = max(1, min(parts, r.size or 1))
    bounds = [r.start + (r.size * i) // parts for i in range(parts + 1)]
    return [OffsetRange(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds)]


def allocate_limit(
    start: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int], limit: int | None
) -> dict[TopicPartitionKey, int]:
    """End offsets of the next micro-batch: at most `limit` records in all, shared in proportion to each
    partition's lag (Spark's rule: a share below 1 rounds up, otherwise down). New partitions start at 0."""
    begin = {tp: start.get(tp, 0) for tp in latest}
    lag = {tp: max(0, latest[tp] - begin[tp]) for tp in latest}
    total = sum(lag.values())
    if limit is None or total <= limit:
        return {tp: max(begin[tp], latest[tp]) for tp in latest}
    out = {}
    for tp, size in lag.items():
        share = limit * size / total
        out[tp] = begin[tp] + min(size, math.ceil(share) if share < 1 else math.floor(share))
    return out


def delay_batch(available: int, min_rows: int, now_ms: int, last_trigger_ms: int | None, max_delay_ms: int) -> bool:
    """Should the next micro-batch wait (`minOffsetsPerTrigger` / `maxTriggerDelay`, Spark's rule)? Yes while
    fewer than `min_rows` records are available and less than `max_delay_ms` has passed since the last
    batch; the first trigger never waits."""
    if last_trigger_ms is None or now_ms - last_trigger_ms >= max_delay_ms:
        return False
    return available < min_rows
