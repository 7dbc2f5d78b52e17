"""The lag probe (retrytopics/runtime/lag.py): one batched request a second at most, never waiting, and only
while a hook wants `lag.measured`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from retrytopics.core.offsets import TopicPartition
from retrytopics.observe.events import Emitter, Event
from retrytopics.runtime.lag import LagProbe
from retrytopics.testing import MemoryClock


class Pending:
    def __init__(self, ends: dict[TopicPartition, int]) -> None:
        self.ends, self.answered = ends, False

    def done(self) -> bool:
        return self.answered

    def result(self) -> dict[TopicPartition, int]:
        return dict(self.ends)


class Port:
    def __init__(self) -> None:
        self.ends: dict[TopicPartition, int] = {}
        self.requests: list[Pending] = []

    def request(self, tps: Sequence[TopicPartition]) -> Pending:
        self.requests.append(Pending({tp: self.ends[tp] for tp in tps}))
        return self.requests[-1]


class Measured:
    wanted_events = frozenset({Event.LAG_MEASURED})

    def __init__(self) -> None:
        self.events: list[dict[str, object]] = []

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        self.events.append(dict(data))


def _probe(hooks: list[object], port: Port, clock: MemoryClock) -> LagProbe:
    assigned = {("tier", 0), ("tier", 1)}
    return LagProbe(
        lambda: port,
        Emitter(hooks),  # type: ignore[arg-type]
        consumer_name="tier",
        group_id="tier",
        assigned=assigned,
        unhandled_from=lambda tp: {("tier", 0): 5, ("tier", 1): None}[tp],
        head_due_ms=lambda tp: 123 if tp == ("tier", 0) else None,
        clock=clock,
    )


def test_one_request_a_second_at_most_and_an_unanswered_one_is_never_waited_for() -> None:
    # setup: partition 0 waits at offset 5, partition 1 is not known yet
    clock, port, measured = MemoryClock(), Port(), Measured()
    port.ends = {("tier", 0): 9, ("tier", 1): 3}
    probe = _probe([measured], port, clock)
    # when: the loop ticks many times within a second, the answer not there yet
    for _ in range(100):
        probe.tick()
    # then: one batched request over both partitions, no measurement
    assert len(port.requests) == 1 and probe.requests == 1
    assert sorted(port.requests[0].ends) == [("tier", 0), ("tier", 1)]
    assert measured.events == []
    # when: the answer comes and a second passes
    port.requests[0].answered = True
    clock.advance(0.5)
    probe.tick()
    # then: the known partition is measured; no new request before the second is over
    assert [(e["partition"], e["lag"], e["due_at"]) for e in measured.events] == [(0, 4, 123)]
    assert len(port.requests) == 1
    clock.advance(0.5)
    probe.tick()
    assert len(port.requests) == 2


def test_nothing_is_asked_while_no_hook_wants_the_lag() -> None:
    clock, port = MemoryClock(), Port()
    port.ends = {("tier", 0): 9, ("tier", 1): 3}
    probe = _probe([], port, clock)
    for _ in range(3):
        clock.advance(2)
        probe.tick()
    assert port.requests == [] and probe.requests == 0
