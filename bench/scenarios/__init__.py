"""The scenarios in order (throughput, lateness, memory, idle cost, Spark, the console, the peer), then the floors of the ratio targets,
then a failover (on 3-node clusters of its own), then share groups, then key ordering, then a retry flood, then handler
concurrency. Each module has `NAME`
and `run(bench) -> list[Result]`."""

from __future__ import annotations

from types import ModuleType

from bench.scenarios import (
    backlog,
    console,
    failover,
    failure,
    flood,
    floor,
    growth,
    idle,
    keyorder,
    lateness,
    loop,
    peer,
    share,
    spark,
    success,
    window,
)

__all__ = ["ALL"]

ALL: tuple[ModuleType, ...] = (
    loop,
    success,
    failure,
    lateness,
    backlog,
    idle,
    growth,
    spark,
    console,
    peer,
    floor,
    failover,
    share,
    keyorder,
    flood,
    window,
)
