"""A handler that raises a BaseException (KeyboardInterrupt here) stops the app cleanly.

Guarantees: the record being handled is neither republished nor dead-lettered nor committed; everything
before it is committed; `run()` re-raises the exception after the consumers have drained and left the group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from retrytopics import Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig

from .conftest import Kit

pytestmark = pytest.mark.broker


def test_keyboard_interrupt_in_a_handler_stops_without_committing_its_record(
    kafka: KafkaConfig, kit: Kit, unique_name: Callable[[str], str], consumer_overrides: dict[str, Any]
) -> None:
    # setup
    source = kit.create(unique_name("orders"), 1)
    group = unique_name("billing")
    app = RetryApp(kafka=kafka, group=group, consumer_overrides=consumer_overrides)
    seen: list[bytes] = []

    @app.handler(source, policy=RetryPolicy(delays=["1s"]))
    def handle(record: Record[bytes]) -> None:
        seen.append(record.value)
        if record.value == b"3":
            raise KeyboardInterrupt
        if record.value == b"1":
            raise RuntimeError("goes to the tier before the interrupt")

    app.provision()
    kit.produce(source, [(None, str(i).encode(), []) for i in range(6)])
    # when
    with pytest.raises(KeyboardInterrupt):
        app.run()
    # then
    assert seen == [b"0", b"1", b"2", b"3"]
    assert kit.committed(group, source, 1) == {0: 3}
    assert [r.value for r in kit.read_all(app.topics(source).tiers[0].topic)] == [b"1"]
    assert kit.read_all(app.topics(source).dlq) == []
    assert not app.running and isinstance(app.error, KeyboardInterrupt)
