"""What a replay trusts:

- a `too_large` DLQ record whose value was replaced by a reference to the record is never written as if the
  reference were the value: it is skipped and counted as `skipped_reference_only`; a `too_many_headers`
  record, which lost its user headers, is skipped as `skipped_headers_dropped`;
- with header keys, a forged unsigned DLQ copy of a source record never displaces the app's own signed
  record, whatever its replay count or position (the verified one is replayed, the copy counted invalid);
- a rerun trusts only what the replay itself wrote: `retry.replay_id` / `retry.replay_original` markers that
  a source-only writer put on source records (even with a genuine `retry.replay_mark` copied from another
  record) do not make it skip the records they name.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, Lineage, encode
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.core.router import too_large_reference
from retrytopics.core.signing import HeaderKeys, sign
from retrytopics.spark.replay import replay

from .conftest import create_topics, produce, read_direct
from .pipeline_data import failure

pytestmark = [pytest.mark.broker, pytest.mark.spark]

KEYS = HeaderKeys.of("the app's header key, 32 bytes or more")


def _pipeline(kafka: KafkaConfig, source: str) -> TopicSet:
    topics = topics_for(source, "billing", (1_000,))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.dlq, 1))
    return topics


def _dlq_record(
    source: str,
    offset: int,
    *,
    value: bytes | None = None,
    reason: DlqReason = DlqReason.EXHAUSTED,
    replay_count: int = 0,
    keys: HeaderKeys | None = None,
    dlq: str = "",
) -> dict[str, object]:
    lineage = (
        Lineage(replay_id="earlier", replayed_at=1, replay_count=replay_count, replay_origin_id="x")
        if replay_count
        else Lineage()
    )
    retry = encode(failure(offset, 3, source=source, tier=None, due_at=None, reason=reason, lineage=lineage))
    key, value = b"k%d" % offset, b"v%d" % offset if value is None else value
    headers = [("tenant", b"acme"), *retry]
    if keys is not None:
        headers = list(sign(keys, dlq, key, value, headers))
    return {"key": key, "value": value, "headers": headers, "partition": 0}


def _values(kafka: KafkaConfig, topic: str, replay_id: str) -> list[bytes]:
    rows = read_direct(kafka, topic, 1)
    return sorted(r[3] for r in rows if r[4] and ("retry.replay_id", replay_id.encode()) in r[4])


def test_a_too_large_reference_is_skipped_never_written_as_the_value(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: a reference record (the runtime's last resort), a too_large record that kept its value, and an
    # ordinary one; the reference names the tier record it stood for, as the runtime writes it
    source = unique_name("orders")
    topics = _pipeline(kafka, source)
    reference = too_large_reference(topics.tiers[0].topic, 0, 17, b"x" * 2_000_000)
    produce(
        kafka,
        topics.dlq,
        [
            _dlq_record(source, 0, value=reference, reason=DlqReason.TOO_LARGE),
            _dlq_record(source, 1, value=b'{"too_large": true, "note": "my own JSON"}', reason=DlqReason.TOO_LARGE),
            _dlq_record(source, 2),
            _dlq_record(source, 3, reason=DlqReason.TOO_MANY_HEADERS),
        ],
    )

    # when
    result = replay(spark, kafka, topics, replay_id="refs-1")

    # then: the two real values are written, the reference is counted and never reaches the source
    assert _values(kafka, source, "refs-1") == [b"v2", b'{"too_large": true, "note": "my own JSON"}']
    assert (result["selected"], result["written"], result.get("skipped_reference_only")) == (4, 2, 1)
    assert result.get("skipped_headers_dropped") == 1
    assert (result["skipped_invalid"], result["skipped_duplicates"]) == (0, 0)


def test_a_forged_unsigned_copy_never_displaces_the_signed_record(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: the app's signed DLQ record for source offset 0, then forged unsigned copies of it that would
    # win "the latest episode" (later in the DLQ, a higher replay count) with another value
    source = unique_name("orders")
    topics = _pipeline(kafka, source)
    produce(
        kafka,
        topics.dlq,
        [
            _dlq_record(source, 0, keys=KEYS, dlq=topics.dlq),
            _dlq_record(source, 0, value=b"forged"),
            _dlq_record(source, 0, value=b"forged, replayed", replay_count=1, reason=DlqReason.EXHAUSTED),
            _dlq_record(source, 0, value=b"forged, wrong key", keys=HeaderKeys.of(b"y" * 32), dlq=topics.dlq),
        ],
    )

    # when
    result = replay(spark, kafka, topics, replay_id="forged-1", header_keys=KEYS)

    # then: the signed record is replayed; the copies are invalid (signature), not "newer duplicates"
    assert (result["selected"], result["written"], result["skipped_duplicates"]) == (4, 1, 0)
    assert result["skipped_invalid_by_problem"] == {"signature": 3}
    assert _values(kafka, source, "forged-1") == [b"v0"]


def test_markers_written_by_a_source_producer_do_not_stop_a_rerun(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: a replay id that wrote records 0 and 1; then records 2 and 3 reach the DLQ
    source = unique_name("orders")
    topics = _pipeline(kafka, source)
    produce(kafka, topics.dlq, [_dlq_record(source, i) for i in (0, 1)])
    assert replay(spark, kafka, topics, replay_id="trust-1")["written"] == 2
    produce(kafka, topics.dlq, [_dlq_record(source, i) for i in (2, 3)])
    # ... and a producer with WRITE on the source only writes markers naming them, one with the genuine
    # `retry.replay_mark` of the replayed record 0 copied onto it
    replayed = {r[3]: dict(r[4]) for r in read_direct(kafka, source, 1)}
    copied_mark = replayed[b"v0"].get("retry.replay_mark", b"")
    marker = [("retry.replay_id", b"trust-1"), ("retry.replay_origin_id", b"x")]
    produce(
        kafka,
        source,
        [
            {"value": b"forged marker", "headers": [*marker, ("retry.replay_original", f"{source}-0-2".encode())]},
            {
                "value": b"forged marker",
                "headers": [
                    *marker,
                    ("retry.replay_original", f"{source}-0-3".encode()),
                    ("retry.replay_mark", copied_mark),
                ],
            },
        ],
    )

    # when: the replay id is run again (a rerun, or the same selection later)
    result = replay(spark, kafka, topics, replay_id="trust-1")

    # then: only what the replay wrote itself counts as written; 2 and 3 are written now, once each
    assert (result["written"], result["skipped_already_replayed"]) == (2, 2)
    assert _values(kafka, source, "trust-1") == [b"forged marker", b"forged marker", b"v0", b"v1", b"v2", b"v3"]
