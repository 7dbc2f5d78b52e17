"""Test without Kafka: unit-test a handler, or run the runtime and a whole app on an in-memory broker.

- `handlers`: build a `Record`, call a sync or async handler, ask where a failure would be routed;
- `broker`: `MemoryBroker`, an in-memory broker behind the runtime's ports, with its fake clock and the
  failures a test injects;
- `clients`: `MemoryClientFactory`, the clients of a `MemoryBroker` for a whole `RetryApp`.

::

    from retrytopics.testing import MemoryBroker, MemoryClientFactory, call, make_record, route_for

Not a Kafka emulator: what the broker does is checked against Apache Kafka by its contract test, and every
delivery guarantee is proven on a real broker by the test suite (docs/testing.md).
"""

from __future__ import annotations

from retrytopics.testing.broker import (
    GroupMetadata,
    MemoryBroker,
    MemoryClock,
    MemoryConsumer,
    MemoryProducer,
    MemoryShareConsumer,
    ShareRecordState,
)
from retrytopics.testing.clients import MemoryClientFactory
from retrytopics.testing.handlers import call, make_record, route_for

__all__ = [
    # Unit tests of handlers
    "call",
    "make_record",
    "route_for",
    # The in-memory broker
    "GroupMetadata",
    "MemoryBroker",
    "MemoryClock",
    "MemoryConsumer",
    "MemoryProducer",
    "MemoryShareConsumer",
    "ShareRecordState",
    # A whole app on it
    "MemoryClientFactory",
]
