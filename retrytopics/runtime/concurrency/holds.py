"""Handler concurrency's hold reason (runtime/consumer/holds.py): a windowed handler's partitions on this
consumer are held while its window holds `max_bytes` of records, and released as soon as a call returns and
frees room. The consumer keeps polling meanwhile: it stays in its group and within `max.poll.interval.ms`.
The record bound needs no pause: the consumer asks for no more records than the window has room for
(`CallWindow.batch_size`), and librdkafka keeps the rest fetched ahead, within its own queue bounds."""

from __future__ import annotations

from retrytopics.core.offsets import TopicPartition
from retrytopics.runtime.concurrency.stage import CallWindow

__all__ = ["WindowFull"]


class WindowFull:
    """Holds a partition while its handler's window on this consumer holds its byte bound."""

    why = "window_full"

    def __init__(self, window: CallWindow) -> None:
        self._window = window

    def holds(self, tp: TopicPartition) -> bool:
        return self._window.holds(tp)
