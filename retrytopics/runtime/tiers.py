"""Tier consumers: one per tier topic, each in its own consumer group, so that tiers deploy and scale
independently (`run_tiers(tiers=["30s"])` in one process, `tiers="all"` in another, or everything in one).

The group id of a tier consumer is its topic name (`<topic>.<group>.retry.<delay>`): unique per source,
group and delay. Head-of-line pausing is in `retrytopics.runtime.pausing`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from retrytopics.core.durations import parse_duration
from retrytopics.core.errors import ConfigError
from retrytopics.runtime.dispatch import Binding
from retrytopics.runtime.loop import LoopSettings

__all__ = ["TIER_CONSUMER_DEFAULTS", "select_tiers", "tier_settings"]

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
