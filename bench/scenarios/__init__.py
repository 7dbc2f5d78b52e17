"""The scenarios of issue 7, in order. Each module has `NAME` and `run(bench) -> list[Result]`."""

from __future__ import annotations

from types import ModuleType

from bench.scenarios import backlog, failure, growth, idle, lateness, loop, spark, success

__all__ = ["ALL"]

ALL: tuple[ModuleType, ...] = (loop, success, failure, lateness, backlog, idle, growth, spark)
