"""Guarantees of the replay job:

- replayed records reach the record's own original topic (or the first tier) with key, value and user
  headers unchanged plus the lineage headers; tier records decode as valid retry state;
- a rerun with the same replay id adds nothing; a dry run writes nothing;
- records already replayed `max_replays` times are skipped or parked; foreign records are never sent;
- a run SIGKILLed midway, then rerun, leaves every selected record exactly once in the destination.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.headers import DlqReason, Lineage, decode, decode_lineage, user_headers
from retrytopics.naming import topics_for
from retrytopics.spark.replay import replay

from .conftest import create_topics, produce, read_direct
from .pipeline_data import T0, failure, record

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _dlq(kafka: KafkaConfig, source: str, n: int, *, extra: list[dict[str, object]] = ()) -> object:  # type: ignore[assignment]
    topics = topics_for(source, "billing", (1_000, 10_000))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.tiers[1].topic, 1), (topics.dlq, 1))
    records = [record(failure(i, 1, source=source, tier=None, due_at=None, exc="ValueError",
                              reason=DlqReason.NON_RETRYABLE), i) for i in range(n)]  # fmt: skip
    produce(kafka, topics.dlq, [*records, *extra])
    return topics


def _replayed(kafka: KafkaConfig, topic: str, replay_id: str) -> list[tuple[object, ...]]:
    return [r for r in read_direct(kafka, topic, 1) if r[4] and ("retry.replay_id", replay_id.encode()) in r[4]]


def test_replay_preserves_records_is_idempotent_and_guards_loops(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    source = unique_name("orders")
    looped = failure(90, 2, source=source, tier=None, due_at=None, reason=DlqReason.EXHAUSTED,
                     lineage=Lineage(replay_id="old", replayed_at=T0, replay_count=1, replay_origin_id="x"))  # fmt: skip
    foreign = failure(91, 1, source="elsewhere", tier=None, due_at=None, reason=DlqReason.EXHAUSTED)
    topics = _dlq(kafka, source, 3, extra=[record(looped, 90), record(foreign, 91)])

    dry = replay(spark, kafka, topics, replay_id="r1", dry_run=True)
    assert (dry["selected"], dry["written"], read_direct(kafka, source, 1)) == (5, 0, [])
    first = replay(spark, kafka, topics, replay_id="r1", reasons=["non_retryable", "exhausted"], park=True)
    again = replay(spark, kafka, topics, replay_id="r1", reasons=["non_retryable", "exhausted"], park=True)
    tier = replay(spark, kafka, topics, replay_id="r3", destination="first_tier", where="original_offset = 1")

    assert {k: first[k] for k in ("selected", "written", "skipped_already_replayed", "skipped_max_replays",
                                  "skipped_foreign", "parked", "destination_topics")} == {
        "selected": 5, "written": 4, "skipped_already_replayed": 0, "skipped_max_replays": 0, "skipped_foreign": 1,
        "parked": 1, "destination_topics": sorted([source, f"{topics.dlq}.parked"])}  # fmt: skip
    assert (again["written"], again["skipped_already_replayed"]) == (0, 4)
    rows = _replayed(kafka, source, "r1")
    assert [(r[2], r[3]) for r in rows] == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(3)]
    for i, row in enumerate(rows):
        assert user_headers(row[4]) == [("trace-id", f"t{i}".encode()), ("dup", b"1"), ("dup", None)]
        lineage = decode_lineage(row[4])
        assert (lineage.replay_id, lineage.replay_count, lineage.replay_origin_id) == ("r1", 1, f"{source}-0-{i}")
    assert len(_replayed(kafka, f"{topics.dlq}.parked", "r1")) == 1
    without_park = replay(spark, kafka, topics, replay_id="r1", dry_run=True)
    assert (without_park["skipped_max_replays"], without_park["parked"]) == (1, 0)
    (tier_row,) = _replayed(kafka, topics.tiers[0].topic, "r3")
    state = decode(tier_row[4])
    assert (state.tier, state.reconsume_times, state.origin_message_id, state.lineage.replay_count) == (
        0, 1, f"{source}-0-1", 1)  # fmt: skip
    assert tier["destination_topics"] == [topics.tiers[0].topic]
    with pytest.raises(ValueError, match="replays never go elsewhere"):
        replay(spark, kafka, topics, replay_id="r4", destination="some.other.topic")


_DRIVER = """
import argparse, json, sys
from pyspark.sql import SparkSession
SparkSession.builder.master("local[1]").config("spark.sql.shuffle.partitions", "2").getOrCreate()
from retrytopics.connectors.config import KafkaConfig
from retrytopics.naming import topics_for
from retrytopics.spark.replay import add_replay_arguments, run_replay_cli
cfg = json.loads(sys.argv[1])
parser = argparse.ArgumentParser()
add_replay_arguments(parser)
kafka = KafkaConfig(bootstrap=cfg["bootstrap"], producer_overrides=cfg["producer_overrides"])
sys.exit(run_replay_cli(parser.parse_args(cfg["argv"]), kafka=kafka, topics=topics_for(cfg["source"], "billing", (1000, 10000))))
"""


def test_a_replay_killed_midway_then_rerun_writes_every_record_exactly_once(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    source, n = unique_name("orders"), 60
    topics = _dlq(kafka, source, n)
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    cfg = {"bootstrap": kafka.bootstrap, "producer_overrides": dict(kafka.producer_overrides), "source": source,
           "argv": ["--replay-id", "crash", "--rate", "12", "--json"]}  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_replayed(kafka, source, "crash")) < 10:
            assert proc.poll() is None, "the replay finished before it could be killed; lower --rate"
            assert time.monotonic() < deadline, "the replay wrote nothing in 120 s"
            time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = len(_replayed(kafka, source, "crash"))
    assert before < n

    result = replay(spark, kafka, topics, replay_id="crash")

    origins = Counter(dict(r[4])["retry.replay_origin_id"] for r in _replayed(kafka, source, "crash"))
    assert origins == Counter({f"{source}-0-{i}".encode(): 1 for i in range(n)})
    assert result["written"] + result["skipped_already_replayed"] == n
    assert result["skipped_already_replayed"] >= before
