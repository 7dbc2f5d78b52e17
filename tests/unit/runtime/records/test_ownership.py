"""Ownership after a long handler call (runtime/records/ownership.py), on the in-memory broker: a call past
`max.poll.interval.ms` makes the app unhealthy and its record is counted abandoned while it runs, once.
"""

from __future__ import annotations

import threading

from retrytopics.testing import MemoryBroker

from ..kit import eventually, stuck_app


def test_a_handler_call_past_the_poll_interval_is_unhealthy_and_counted_abandoned_once_while_it_runs() -> None:
    broker, entered, release = MemoryBroker(), threading.Event(), threading.Event()
    broker.create_topic("orders")
    broker.append("orders", b"stuck")
    app = stuck_app(broker, entered, release, consumer_overrides={"max.poll.interval.ms": 300})
    app.start(main=True)
    try:
        assert entered.wait(10)
        eventually(lambda: not app.healthy and app.stats.abandoned == 1)
        release.set()
        eventually(lambda: app.healthy)
    finally:
        release.set()
        assert app.stop(10)
    assert app.stats.abandoned == 1  # not counted again when the call returned
