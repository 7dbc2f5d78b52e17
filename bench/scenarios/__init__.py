"""The scenarios of issues 7 and 13 and the console's (issue 26), in order, then the floors of the ratio targets,
then the failover of issue 22 (on 3-node clusters of its own). Each module has `NAME`
and `run(bench) -> list[Result]`."""

from __future__ import annotations

from types import ModuleType

from bench.scenarios import (
    backlog,
    console,
    failover,
    failure,
    floor,
    growth,
    idle,
    lateness,
    loop,
    peer,
    spark,
    success,
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
)
