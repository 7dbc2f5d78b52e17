"""What a consumer loop is: its settings, and which loops an app runs.

- The main consumer: one consumer in the app's group, subscribed to every handled source topic. Source
  records never carry trusted retry state: incoming `retry.*` headers are ignored there (a producer of the
  source topic could forge them), so every source record gets a normal first delivery.
- Tier consumers: one per tier topic, each in its own consumer group, so that tiers deploy and scale
  independently (`run_tiers(tiers=["30s"])` in one process, `tiers="all"` in another, or everything in one).
  The group id of a tier consumer is its topic name (`<topic>.<group>.retry.<delay>`): unique per source,
  group and delay. Their waiting is runtime/waiting.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retrytopics.core.durations import parse_duration
from retrytopics.core.errors import ConfigError
from retrytopics.runtime.records.calls import Binding

__all__ = ["TIER_CONSUMER_DEFAULTS", "LoopSettings", "main_settings", "select_tiers", "tier_settings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSettings:
    """How one consumer loop runs."""

    name: str
    group_id: str
    topics: tuple[str, ...]
    batch_size: int = 500
    commit_every: int = 500
    commit_interval_ms: int = 1000
    max_wait_ms: int = 1000
    drain_timeout_s: float = 10.0
    revoke_drain_timeout_s: float = 5.0
    exactly_once: bool = False
    #: a tier record due within this many ms waits in memory rather than in Kafka (0: always in Kafka)
    wait_in_memory_ms: int = 1000
    #: at most this many records wait in memory per partition
    wait_in_memory_records: int = 2000
    #: the loop reports itself unhealthy while its consumer has not joined the group this long after starting
    join_timeout_s: float = 60.0
    #: records read per partition of each destination when partitions are assigned (0: no seeding; see
    #: runtime/records/duplicates.py), and for at most this long
    seed_last: int = 1000
    seed_timeout_s: float = 5.0
    #: at-least-once: commit as soon as a poll delivered acknowledgements of hand-offs (see `_commit_acked`)
    commit_on_ack: bool = True


def main_settings(group: str, topics: Sequence[str], **options: object) -> LoopSettings:
    """Settings of the main consumer of `group` over `topics`."""
    return LoopSettings(name=f"{group}:main", group_id=group, topics=tuple(topics), **options)  # type: ignore[arg-type]


#: librdkafka settings tier consumers start from (the app's consumer_overrides win). A resumed partition
#: waits for any fetch already in flight on its broker connection, and an idle fetch is held by the broker
#: for up to fetch.wait.max.ms (librdkafka's default 500 ms): 50 ms keeps a due record's lateness low, for
#: about 20 empty fetches a second while some partition is unpaused and idle (none while all are paused).
TIER_CONSUMER_DEFAULTS: dict[str, int] = {"fetch.wait.max.ms": 50, "max.partition.fetch.bytes": 131072}


def select_tiers(bindings: Mapping[str, Binding], tiers: str | Sequence[str]) -> list[str]:
    """Tier topics chosen by "all", or by delays ("30s") and/or tier topic names; unknown entries are refused."""
    every = [t.topic for b in bindings.values() for t in b.ctx.topics.tiers]
    if tiers == "all":
        return every
    if isinstance(tiers, str):
        tiers = [tiers]
    chosen: list[str] = []
    for i, wanted in enumerate(tiers):
        if wanted in every:
            matches = [wanted]
        else:
            delay = parse_duration(wanted, field=f"tiers[{i}]")
            matches = [t.topic for b in bindings.values() for t in b.ctx.topics.tiers if t.delay_ms == delay]
        if not matches:
            raise ConfigError(f"tiers[{i}]", wanted, f"no handler has this tier; tier topics: {every}")
        chosen += [m for m in matches if m not in chosen]
    return chosen


def tier_settings(bindings: Mapping[str, Binding], tiers: str | Sequence[str], **options: object) -> list[LoopSettings]:
    """One consumer loop per selected tier topic."""
    return [
        LoopSettings(name=topic, group_id=topic, topics=(topic,), **options)  # type: ignore[arg-type]
        for topic in select_tiers(bindings, tiers)
    ]
