"""How the confluent-kafka consumer adapter (`connectors/clients.py`) takes a poll's client messages apart.

Guarantees held here, with stand-ins for confluent-kafka's messages (the calls the adapter makes, answered as
the client answers them) behind the adapter's `_poll`; what the real client returns is tested on Apache Kafka
(tests/integration/test_bad_header_key_consumer.py, tests/integration/runtime/test_memory_broker_contract.py):

- `consume` and `consume_runs` let go of each client message once they have read it: a poll's client
  messages and what is made of them are never all alive at once (together they would set off the cyclic GC
  on every poll, which then moves them on, still alive, to the generations whose collections walk the heap);
- `consume_runs` returns what `split_runs` makes of `consume` for the same poll, and a poll that falls back to
  Messages keeps the client's order, its records before the fallback included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError

from retrytopics.connectors.clients import KafkaConsumer
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.ports import Polled, split_runs

TOPIC, OTHER = "orders", "audit"


class _Alive:
    """How many stand-ins of a poll exist, and the most of those read already that were still alive when the
    adapter read the next one."""

    def __init__(self) -> None:
        self.now = 0
        self.created = 0
        self.read = 0
        self.most_kept = 0

    def born(self) -> None:
        self.now += 1
        self.created += 1

    def reading(self) -> None:
        unread = self.created - self.read  # this one included
        self.read += 1
        self.most_kept = max(self.most_kept, self.now - unread)


class _ClientRecord:
    """A consumed record as confluent-kafka's `Message` answers for it (None from `error()`)."""

    def __init__(self, alive: _Alive, topic: str, partition: int, offset: int, headers: list[Any] | None) -> None:
        self._alive = alive
        self._coordinates = (topic, partition, offset)
        self._headers = headers
        alive.born()

    def __del__(self) -> None:
        self._alive.now -= 1

    def error(self) -> None:
        self._alive.reading()

    def topic(self) -> str:
        return self._coordinates[0]

    def partition(self) -> int:
        return self._coordinates[1]

    def offset(self) -> int:
        return self._coordinates[2]

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + self._coordinates[2]

    def key(self) -> bytes:
        return f"k{self._coordinates[2]}".encode()

    def value(self) -> bytes:
        return f"v{self._coordinates[1]}-{self._coordinates[2]}".encode()

    def headers(self) -> list[Any] | None:
        return None if self._headers is None else list(self._headers)


class _PartitionEnd:
    """A consumed error: the end of a partition, which the adapter skips without a word."""

    def __init__(self, alive: _Alive) -> None:
        self._alive = alive
        alive.born()

    def __del__(self) -> None:
        self._alive.now -= 1

    def error(self) -> KafkaError:
        self._alive.reading()
        return KafkaError(KafkaError._PARTITION_EOF)


#: (topic, partition, offset, headers) of a poll, in the client's order; None: a partition's end
Poll = list[tuple[str, int, int, list[Any] | None] | None]


def _plain_poll(records: int) -> Poll:
    """`records` of TOPIC in runs of 100 over partitions 0 and 1, a record of OTHER after each run, two of
    TOPIC's records with a user header, and a partition's end in the middle."""
    poll: Poll = []
    offsets = {0: 0, 1: 0}
    for i in range(records):
        partition = (i // 100) % 2
        headers = [("trace", b"t1")] if i in (7, 408) else None
        poll.append((TOPIC, partition, offsets[partition], headers))
        offsets[partition] += 1
        if i % 100 == 99:
            poll.append((OTHER, 0, i // 100, None))
        if i == records // 2:
            poll.append(None)
    return poll


@pytest.fixture
def consumer() -> Iterator[KafkaConsumer]:
    # nothing listens there: its client is never asked for a record (each test replaces `_poll`)
    adapter = KafkaConsumer(KafkaConfig(bootstrap="127.0.0.1:9"), group_id="adapter-polls")
    yield adapter
    adapter.close()


def _served(consumer: KafkaConsumer, monkeypatch: pytest.MonkeyPatch, poll: Poll) -> _Alive:
    """Makes every `_poll` of `consumer` return fresh stand-ins of `poll` (the test keeps none of them)."""
    alive = _Alive()

    def fresh(_max_records: int, _timeout_s: float) -> list[Any]:
        return [
            _PartitionEnd(alive) if item is None else _ClientRecord(alive, *item)  # type: ignore[misc]
            for item in poll
        ]

    monkeypatch.setattr(consumer, "_poll", fresh)
    return alive


@pytest.mark.parametrize("path", ["consume", "consume_runs"])
def test_each_client_message_is_let_go_once_read(
    consumer: KafkaConsumer, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A poll of 1,000 records: when the adapter reads one, at most one it read before is still alive, and
    every record comes out. Before the fix, every client message of the poll was alive until the whole poll
    was built (1,010 read ones kept at the last read)."""
    poll = _plain_poll(1000)
    alive = _served(consumer, monkeypatch, poll)
    read: Callable[[], Any] = (
        (lambda: consumer.consume(1000, 0))
        if path == "consume"
        else (lambda: consumer.consume_runs(1000, 0, frozenset({TOPIC})))
    )

    out = read()

    assert alive.read == len(poll)
    assert alive.most_kept <= 1, alive.most_kept
    assert alive.now == 0
    coordinates = [(t, p, o) for t, p, o, _ in filter(None, poll)]
    if path == "consume":
        assert [(m.topic, m.partition, m.offset) for m in out] == coordinates
        return
    assert isinstance(out, Polled)
    got = [(m.topic, m.partition, m.offset) for m in out.messages]
    got += [(r.topic, r.partition, r.offset) for run in out.runs for r in run]
    assert sorted(got) == sorted(coordinates) and len(got) == 1000 + 10


def test_consume_runs_is_split_runs_of_consume(consumer: KafkaConsumer, monkeypatch: pytest.MonkeyPatch) -> None:
    """For the same poll, `consume_runs` gives what `split_runs` makes of `consume`: the same Records, field
    by field (origin ids, user headers, timestamps), in the same runs, and the other topic's Messages in the
    client's order."""
    _served(consumer, monkeypatch, _plain_poll(450))
    expected = split_runs(consumer.consume(500, 0), frozenset({TOPIC}))

    got = consumer.consume_runs(500, 0, frozenset({TOPIC}))

    assert got == expected
    assert [len(run) for run in got.runs] == [250, 200]
    assert [r.headers for run in got.runs for r in run if r.headers] == [(("trace", b"t1"),), (("trace", b"t1"),)]


@pytest.mark.parametrize("at", [0, 1, 5, 9])
def test_a_poll_that_falls_back_to_messages_keeps_the_client_order(
    consumer: KafkaConsumer, monkeypatch: pytest.MonkeyPatch, at: int
) -> None:
    """A record of the runs' topic with a `retry.*` header makes the whole poll Messages: the records read
    before it (built as Records already, in runs that a record of another topic or of the other partition
    interrupted), it, and the ones after it (a partition's end skipped), exactly as `consume` gives them."""
    interleaved: Poll = [
        (TOPIC, 0, 0, None),
        (TOPIC, 0, 1, [("trace", b"a")]),
        (OTHER, 0, 0, None),
        (TOPIC, 0, 2, None),
        (TOPIC, 1, 0, None),
        (OTHER, 0, 1, None),
        (OTHER, 0, 2, None),
        (TOPIC, 1, 1, None),
        (TOPIC, 0, 3, None),
        None,
        (TOPIC, 1, 2, None),
    ]
    poll = [*interleaved[:at], (TOPIC, 2, 7, [("retry.tier", b"0")]), *interleaved[at:]]
    _served(consumer, monkeypatch, poll)
    expected = consumer.consume(100, 0)

    got = consumer.consume_runs(100, 0, frozenset({TOPIC}))

    assert got.runs == []
    assert got.messages == expected
    assert [(m.topic, m.partition, m.offset) for m in got.messages] == [(t, p, o) for t, p, o, _ in filter(None, poll)]
