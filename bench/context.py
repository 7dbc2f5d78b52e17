"""What every scenario gets: the broker, the client config, the sizes of this mode, and child launching."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench.measure import Child
from retrytopics.connectors.config import KafkaConfig

__all__ = ["CONSUMER_OVERRIDES", "Bench"]

T = TypeVar("T")

#: Group membership: on tansu a join takes about session.timeout.ms / 2; Apache Kafka is unaffected.
CONSUMER_OVERRIDES: dict[str, str | int | float | bool] = {"session.timeout.ms": 6000}


@dataclass
class Bench:
    """One benchmark run. Topic and group names are unique per call, so scenarios never share state."""

    bootstrap: str
    quick: bool
    broker: str = "apache"  # the kind of local broker (connectors.brokers)
    partitions: int = 3
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def kafka(self) -> KafkaConfig:
        """The product's client config for this broker (no embedded-broker producer override: batches on)."""
        return KafkaConfig(bootstrap=self.bootstrap, consumer_overrides=CONSUMER_OVERRIDES)

    def size(self, quick: T, full: T) -> T:
        return quick if self.quick else full

    def name(self, stem: str) -> str:
        return f"bench.{stem}.{next(self._ids)}"

    def child(self, role: str, args: Mapping[str, Any]) -> Child:
        return Child(
            "bench.child",
            role,
            {
                "bootstrap": self.bootstrap,
                "consumer_overrides": CONSUMER_OVERRIDES,
                "partitions": self.partitions,
                **args,
            },
        )

    def run_to_done(self, role: str, args: Mapping[str, Any], *, timeout_s: float = 600) -> dict[str, Any]:
        """Run a child role until it reports "done"; its report plus `peak_rss_mb`, `cpu_s` (whole life) and
        `cpu_us_per_record`: the child's CPU (every thread, librdkafka's included) from "ready" to "done" per
        record counted, unless the child reports its own (the runtime's: first to last record). On a shared machine a rate moves with the neighbours' load; CPU per record much less."""
        with self.child(role, {"timeout_s": timeout_s, **args}) as child:
            child.wait_for("ready", timeout_s=timeout_s)
            done = child.wait_for("done", timeout_s=timeout_s + 30)
            cpu_s, _wall = child.cpu_since("ready")
            child.join(timeout_s=60)
            samples = child.samples_since()
        count = done.get("count") or args.get("n")
        return {
            **done,
            "peak_rss_mb": max((s.rss for s in samples), default=0) / 2**20,
            "cpu_s": samples[-1].cpu_s if samples else None,
            # a child that measures its own (the runtime's, first to last record) is more precise than this
            "cpu_us_per_record": done.get("cpu_us_per_record") or (round(cpu_s / count * 1e6, 2) if count else None),
        }
