"""Handler concurrency's configuration: how many calls of one handler a consumer keeps in flight, and which
records may never be in flight together (docs/concurrency.md).

Pure: standard library only. The runtime part is runtime/concurrency/.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from retrytopics.core.errors import ConfigError

__all__ = ["Concurrency", "OrderMode", "concurrency_of"]

#: the default bound on the bytes (keys and values) of the records in one consumer's window
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: the most calls one consumer keeps in flight: a plain handler's call holds a thread
MAX_CALLS = 10_000


class OrderMode(enum.StrEnum):
    """Which records of one partition may be in flight together: the trade between order and throughput."""

    KEY = "key"
    """Two records of one key (same partition) are never in flight together and start in offset order;
    records of other keys run side by side (the default). Keyless records have no order to keep."""

    PARTITION = "partition"
    """One record of a partition at a time, in offset order: today's order, with only the partitions of one
    consumer in flight together."""

    NONE = "none"
    """No order: any records in flight together, the most throughput. A later record may finish first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Concurrency:
    """Up to `calls` handler calls in flight in one consumer, over at most `max_bytes` of record keys and
    values, in order `order`::

        @app.handler("orders", concurrency=Concurrency(calls=200, order=OrderMode.KEY))

    `concurrency=200` is the same with the defaults. A full window pauses the consumer's partitions of the
    handler until calls return (it keeps polling, so it stays in its group). An offset is committed only when
    every record below it is handled or durably handed off, so a crash re-reads at most the window. Too large
    a window with a plain (not `async def`) handler costs one thread per call in flight.
    """

    calls: int = 1
    max_bytes: int = DEFAULT_MAX_BYTES
    order: OrderMode = OrderMode.KEY

    def __post_init__(self) -> None:
        if type(self.calls) is not int or not 1 <= self.calls <= MAX_CALLS:
            raise ConfigError("concurrency.calls", self.calls, f"expected an int from 1 to {MAX_CALLS}")
        if type(self.max_bytes) is not int or self.max_bytes < 1:
            raise ConfigError("concurrency.max_bytes", self.max_bytes, "expected an int >= 1")
        try:
            object.__setattr__(self, "order", OrderMode(self.order))
        except ValueError:
            raise ConfigError(
                "concurrency.order", self.order, f"expected one of {[m.value for m in OrderMode]}"
            ) from None

    @property
    def windowed(self) -> bool:
        """Whether calls run in a window at all (1: one call at a time on the consumer's thread, as ever)."""
        return self.calls > 1


def concurrency_of(value: object, *, field: str = "concurrency") -> Concurrency:
    """`value` as a `Concurrency`: an int is the number of calls, with the defaults."""
    if isinstance(value, Concurrency):
        return value
    if type(value) is not int:
        raise ConfigError(field, value, "expected an int (calls in flight) or a Concurrency")
    if not 1 <= value <= MAX_CALLS:
        raise ConfigError(field, value, f"expected an int from 1 to {MAX_CALLS}")
    return Concurrency(calls=value)
