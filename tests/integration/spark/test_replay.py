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
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.headers import DlqReason, Lineage, decode, decode_lineage, user_headers
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.spark.replay import replay

from .conftest import create_topics, produce, read_direct
from .pipeline_data import T0, failure, record

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _dlq(kafka: KafkaConfig, source: str, n: int, *, extra: Sequence[dict[str, object]] = ()) -> TopicSet:
    topics = topics_for(source, "billing", (1_000, 10_000))
    create_topics(kafka, (source, 1), (topics.tiers[0].topic, 1), (topics.tiers[1].topic, 1), (topics.dlq, 1))
    records = [
        record(
            failure(i, 1, source=source, tier=None, due_at=None, exc="ValueError", reason=DlqReason.NON_RETRYABLE), i
        )
        for i in range(n)
    ]
    produce(kafka, topics.dlq, [*records, *extra])
    return topics


def _replayed(kafka: KafkaConfig, topic: str, replay_id: str) -> list[tuple[object, ...]]:
    return [r for r in read_direct(kafka, topic, 1) if r[4] and ("retry.replay_id", replay_id.encode()) in r[4]]


def test_replay_preserves_records_is_idempotent_and_guards_loops(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    source = unique_name("orders")
    looped = failure(
        90,
        2,
        source=source,
        tier=None,
        due_at=None,
        reason=DlqReason.EXHAUSTED,
        lineage=Lineage(replay_id="old", replayed_at=T0, replay_count=1, replay_origin_id="x"),
    )
    foreign = failure(91, 1, source="elsewhere", tier=None, due_at=None, reason=DlqReason.EXHAUSTED)
    topics = _dlq(kafka, source, 3, extra=[record(looped, 90), record(foreign, 91)])

    dry = replay(spark, kafka, topics, replay_id="r1", dry_run=True)
    assert (dry["selected"], dry["written"], read_direct(kafka, source, 1)) == (5, 0, [])
    first = replay(spark, kafka, topics, replay_id="r1", reasons=["non_retryable", "exhausted"], park=True)
    again = replay(spark, kafka, topics, replay_id="r1", reasons=["non_retryable", "exhausted"], park=True)
    tier = replay(spark, kafka, topics, replay_id="r3", destination="first_tier", where="original_offset = 1")

    assert {
        k: first[k]
        for k in (
            "selected",
            "written",
            "skipped_already_replayed",
            "skipped_max_replays",
            "skipped_foreign",
            "parked",
            "destination_topics",
        )
    } == {
        "selected": 5,
        "written": 4,
        "skipped_already_replayed": 0,
        "skipped_max_replays": 0,
        "skipped_foreign": 1,
        "parked": 1,
        "destination_topics": sorted([source, f"{topics.dlq}.parked"]),
    }
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
        0,
        1,
        f"{source}-0-1",
        1,
    )
    assert tier["destination_topics"] == [topics.tiers[0].topic]
    with pytest.raises(ValueError, match="replays never go elsewhere"):
        replay(spark, kafka, topics, replay_id="r4", destination="some.other.topic")


_DRIVER = """
import argparse, json, sys
from pyspark.sql import SparkSession
from retrytopics.spark.session import warm_up_workers
warm_up_workers(SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "1")
                .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1").getOrCreate())
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.spark.replay import add_replay_arguments, run_replay_cli
cfg = json.loads(sys.argv[1])
parser = argparse.ArgumentParser()
add_replay_arguments(parser)
kafka = KafkaConfig(bootstrap=cfg["bootstrap"], producer_overrides=cfg["producer_overrides"])
sys.exit(run_replay_cli(parser.parse_args(cfg["argv"]), kafka=kafka, topics=topics_for(cfg["source"], "billing", (1000, 10000))))
"""


@dataclass
class KilledReplay:
    """A replay run in its own Spark driver process, SIGKILLed once it has written `kill_after` records."""

    topics: TopicSet
    records: int
    kill_after: int = 10
    written_when_killed: int | None = None
    problem: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


#: how long the replay's own cold Spark driver may take to write its first records, on a loaded machine
_FIRST_WRITES_S = 420


def _kill_midway(kafka: KafkaConfig, proc: subprocess.Popen[bytes], run: KilledReplay) -> None:
    try:
        deadline = time.monotonic() + _FIRST_WRITES_S
        while len(_replayed(kafka, run.topics.source, "crash")) < run.kill_after:
            if proc.poll() is not None:
                run.problem = f"the replay ended (status {proc.returncode}) before it could be killed; lower --rate"
                return
            if time.monotonic() > deadline:
                run.problem = f"the replay wrote nothing in {_FIRST_WRITES_S} s"
                return
            time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        run.written_when_killed = len(_replayed(kafka, run.topics.source, "crash"))
        run.done.set()


@pytest.fixture(scope="module", autouse=True)
def killed_replay(kafka: KafkaConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilledReplay]:
    """Starts, as the module starts, the replay that the kill test SIGKILLs midway: its own Spark driver takes
    about 15 s to boot and reach its first write, which then overlaps the module's other tests."""
    run = KilledReplay(_dlq(kafka, f"orders-killed-{os.getpid()}-{uuid.uuid4().hex[:6]}", 60), 60)
    script = tmp_path_factory.mktemp("killed") / "driver.py"
    script.write_text(_DRIVER)
    cfg = {
        "bootstrap": kafka.bootstrap,
        "producer_overrides": dict(kafka.producer_overrides),
        "source": run.topics.source,
        "argv": ["--replay-id", "crash", "--rate", "12", "--json"],
    }
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(cfg)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watcher = threading.Thread(target=_kill_midway, args=(kafka, proc, run), daemon=True)
    watcher.start()
    yield run
    if proc.poll() is None:  # the kill test did not run: stop the driver all the same
        os.killpg(proc.pid, signal.SIGKILL)
    watcher.join(30)


@pytest.mark.timeout(_FIRST_WRITES_S + 300)  # the driver's boot, then the rerun's job, on a loaded machine
def test_a_replay_killed_midway_then_rerun_writes_every_record_exactly_once(
    spark: SparkSession, kafka: KafkaConfig, killed_replay: KilledReplay
) -> None:
    # setup: the replay process was SIGKILLed after some of its records, and before all of them
    run = killed_replay
    assert run.done.wait(_FIRST_WRITES_S + 30), "the killed replay never reached its kill point"
    assert run.problem is None, run.problem
    assert run.written_when_killed is not None and run.kill_after <= run.written_when_killed < run.records

    # when
    result = replay(spark, kafka, run.topics, replay_id="crash")

    # then
    source = run.topics.source
    origins = Counter(dict(r[4])["retry.replay_origin_id"] for r in _replayed(kafka, source, "crash"))
    assert origins == Counter({f"{source}-0-{i}".encode(): 1 for i in range(run.records)})
    assert result["written"] + result["skipped_already_replayed"] == run.records
    assert result["skipped_already_replayed"] >= run.written_when_killed
