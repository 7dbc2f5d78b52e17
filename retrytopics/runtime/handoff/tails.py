"""A partition's tail past its last record: commit positions moved to the consumer's position once settled.

A read_committed consumer is never handed a transaction's commit or abort markers, nor an aborted transaction's
records, so committing `last finished + 1` leaves a partition that ends in them short of its end for good: lag
that never clears (consumer-group tools, our lag metrics, alerts). When a poll comes back empty, each partition
whose every delivered record is finished (`OffsetTracker.settled`) has its commit position moved to the
consumer's position (`OffsetTracker.skip_to`); the finisher commits it as it commits anything else. The position
is asked only then: a local call, never per record.
"""

from __future__ import annotations

from retrytopics.core.offsets import OffsetTracker, TopicPartition
from retrytopics.core.ports import ConsumerPort

__all__ = ["skip_settled_tails"]


def skip_settled_tails(consumer: ConsumerPort, tracker: OffsetTracker) -> list[TopicPartition]:
    """Move each settled partition's commit position to the consumer's position where it lies ahead; the
    partitions that moved."""
    settled = tracker.settled()
    if not settled:
        return []
    return [tp for tp, position in consumer.positions(settled).items() if tracker.skip_to(tp, position)]
