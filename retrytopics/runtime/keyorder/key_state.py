"""The key state of a key-ordered handler as a consumer reads it when partitions are assigned
(docs/key-ordering.md, section 5): the records of its key-state topic, decoded, in log order, ready for
`SourceChains.rebuild` (a main consumer: its source partitions' partitions of the topic) or
`TierPassages.rebuild` (a tier consumer: every partition).

The read must complete. Unlike the seeding of hand-offs (runtime/records/duplicates.py), which may give up
(a missed hand-off is a duplicate), a partition started without its key state could hand a blocked key's next
record to the handler before the key's head: an order violation. So a failed or unfinished read is the
reader's `KafkaClientError`, for the caller to keep the partition unstarted and try again.

Every record is untrusted input: one that does not decode (`decode_record`), or that names a source partition
other than the one it was read from (the writers always write a chain's records to its source partition), is
skipped and counted, never trusted; one WARNING per read says how many and the first reason, never a value.
With header keys (`RetryApp(header_key=...)`) every key-state record, tombstones included, carries a
`retry.signature` (`core.keyorder.state_records.encode_signed`), and one that is unsigned or does not verify
is skipped and counted as `forged` the same way, before it is decoded (docs/key-ordering.md, section 9).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from retrytopics.core.errors import KeyStateDecodeError
from retrytopics.core.keyorder.state_records import KeyStateRecord, decode_record
from retrytopics.core.ports import Message
from retrytopics.core.signing import HeaderKeys, verify_state

__all__ = ["KeyState", "KeyStateReader", "Skipped", "decode_message", "read_key_state"]

log = logging.getLogger("retrytopics.runtime")

#: `read(topic, partitions, timeout_s)`: every record of those partitions (None: all) up to their end, or a
#: `KafkaClientError` (`ClientFactory.read_to_end`)
KeyStateReader = Callable[[str, Sequence[int] | None, float], Iterable[Message]]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyState:
    """What a read of a key-state topic found: its decoded records in log order, how many were skipped (as
    malformed, or as unsigned or forged: see the module docstring), and per partition the offset after the last
    record read (where a live reader goes on from; a partition with nothing read is not in it)."""

    records: tuple[KeyStateRecord, ...]
    malformed: int
    forged: int = 0
    next_offsets: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Skipped:
    """Why a key-state record read is not trusted; `forged`: its signature is missing or wrong (with header
    keys), else it does not decode."""

    reason: str
    forged: bool = False


def read_key_state(
    read: KeyStateReader,
    topic: str,
    partitions: Sequence[int] | None,
    *,
    timeout_s: float,
    keys: HeaderKeys | None = None,
) -> KeyState:
    """Read `topic`'s `partitions` (None: all) to their end and decode them (see the module docstring)."""
    records: list[KeyStateRecord] = []
    skipped = {False: 0, True: 0}
    first_reason = ""
    next_offsets: dict[int, int] = {}
    for msg in read(topic, partitions, timeout_s):
        next_offsets[msg.partition] = max(next_offsets.get(msg.partition, 0), msg.offset + 1)
        record = decode_message(msg, keys)
        if not isinstance(record, Skipped):
            records.append(record)
            continue
        skipped[record.forged] += 1
        first_reason = first_reason or record.reason
    if skipped[False] or skipped[True]:
        log.warning(
            "%s: %d key-state records skipped as malformed, %d as unsigned or forged (first: %s)",
            topic,
            skipped[False],
            skipped[True],
            first_reason,
        )
    return KeyState(records=tuple(records), malformed=skipped[False], forged=skipped[True], next_offsets=next_offsets)


def decode_message(msg: Message, keys: HeaderKeys | None = None) -> KeyStateRecord | Skipped:
    """The key-state record `msg` holds, or why it is skipped (see the module docstring)."""
    if keys is not None:
        problem = verify_state(keys, msg.topic, msg.key, msg.value, msg.headers)
        if problem is not None:
            return Skipped(f"signature {problem}", forged=True)
    try:
        record = decode_record(msg.key, msg.value)
    except KeyStateDecodeError as exc:
        return Skipped(f"{exc.field}: {exc.reason}")
    if record.chain.source_partition != msg.partition:
        return Skipped("chain: names another source partition than the one it was read from")
    return record
