"""Guarantees of the replay job on untrusted DLQ records:

- a forged DLQ record (a partition the source does not have, a replay count one replay would overflow, a
  tier's due time beyond Spark's timestamps) is skipped and counted with its problem, and every valid record
  is still replayed, once; a rerun of a run that stopped halfway completes it;
- to the first tier, with fewer partitions than the source, keyed records are partitioned by key and keyless
  ones by their original partition modulo the tier's count;
- `--where` is a filter over the typed columns: `reflect`, `java_method`, `raise_error`, casts are refused
  before anything is read;
- the `retrytopics replay` command does the same, exits 0, and prints no JVM, log4j or pandas noise on stderr.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_producer
from retrytopics.core.errors import ConfigError
from retrytopics.core.headers import DlqReason, Lineage, encode
from retrytopics.core.naming import TopicSet, topics_for
from retrytopics.core.signing import mark_keys, replay_mark
from retrytopics.spark import ledger
from retrytopics.spark.replay import replay

from .conftest import Header, cli_env, create_topics, produce, read_direct
from .pipeline_data import T0, failure

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _dlq_record(
    source: str,
    offset: int,
    partition: int,
    *,
    key: bytes | None = b"k",
    replay_count: int = 0,
    forge: Sequence[Header] = (),
) -> dict[str, object]:
    """A DLQ record as the runtime writes it; `forge` replaces (or adds) retry headers by name."""
    h = failure(
        offset,
        3,
        source=source,
        tier=None,
        due_at=None,
        reason=DlqReason.EXHAUSTED,
        lineage=Lineage(
            replay_id="old" if replay_count else None,
            replayed_at=T0 if replay_count else None,
            replay_count=replay_count,
            replay_origin_id="x" if replay_count else None,
        ),
    )
    headers = [(k, str(partition).encode() if k == "retry.original_partition" else v) for k, v in encode(h)]
    forged = dict(forge)
    headers = [(k, forged.pop(k, v)) for k, v in headers] + list(forged.items())
    return {"key": key, "value": f"v{offset}".encode(), "headers": headers}


def _origins(kafka: KafkaConfig, topic: str, partitions: int, replay_id: str) -> Counter[tuple[int, bytes]]:
    """(partition, replay origin id) of every record `replay_id` wrote to `topic`."""
    rows = read_direct(kafka, topic, partitions)
    mine = [r for r in rows if r[4] and ("retry.replay_id", replay_id.encode()) in r[4]]
    return Counter((r[0], dict(r[4])["retry.replay_origin_id"]) for r in mine)


def _pipeline(kafka: KafkaConfig, source: str, partitions: int, tier_partitions: int) -> TopicSet:
    topics = topics_for(source, "billing", (1_000, 10_000))
    create_topics(
        kafka,
        (source, partitions),
        (topics.tiers[0].topic, tier_partitions),
        (topics.tiers[1].topic, tier_partitions),
        (topics.dlq, 1),
    )
    return topics


def test_forged_dlq_records_are_skipped_with_their_problem_and_a_stopped_run_is_completed(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: six valid records (source partitions 0 and 1) and four forged ones among them
    source = unique_name("orders")
    topics = _pipeline(kafka, source, 2, 2)
    valid = [_dlq_record(source, i, i % 2) for i in range(6)]
    forged = [
        _dlq_record(source, 10, 999),  # _UNKNOWN_PARTITION after part of the selection was written
        _dlq_record(source, 11, 1, replay_count=2**31 - 1),  # ARITHMETIC_OVERFLOW on +1
        _dlq_record(source, 0, 999, replay_count=5),  # valid record 0's id: must not shadow it
        _dlq_record(source, 12, 0, forge=[("retry.tier", b"0"), ("retry.due_at", str(2**63 - 1).encode())]),
    ]
    produce(kafka, topics.dlq, [valid[0], *forged[:2], *valid[1:4], *forged[2:], *valid[4:]])
    # ... and a run that stopped after writing records 0..2 (its start marks first, as replay() does)
    nonce = bytes(range(32))
    ledger.append(
        kafka,
        topics.dlq,
        "fix-1",
        {"event": "started", "marks": ledger.watermarks(kafka, [source]), "nonce": nonce.hex()},
    )
    mark_key = mark_keys(nonce, None)[0]
    produce(
        kafka,
        source,
        [
            {
                "key": b"k",
                "value": f"v{i}".encode(),
                "partition": i % 2,
                "headers": [
                    ("retry.replay_id", b"fix-1"),
                    ("retry.replay_origin_id", f"{source}-0-{i}".encode()),
                    ("retry.replay_original", f"{source}-{i % 2}-{i}".encode()),
                    ("retry.replay_mark", replay_mark(mark_key, "fix-1", source, f"{source}-{i % 2}-{i}").encode()),
                ],
            }
            for i in range(3)
        ],
    )

    # when
    result = replay(spark, kafka, topics, replay_id="fix-1", allow_replayed=True)

    # then
    assert {
        k: result[k]
        for k in (
            "selected",
            "written",
            "skipped_already_replayed",
            "skipped_invalid",
            "skipped_invalid_by_problem",
            "skipped_duplicates",
        )
    } == {
        "selected": 10,
        "written": 3,
        "skipped_already_replayed": 3,
        "skipped_invalid": 4,
        "skipped_invalid_by_problem": {"original_partition": 2, "replay_count": 1, "tier": 1},
        "skipped_duplicates": 0,
    }
    assert _origins(kafka, source, 2, "fix-1") == Counter({(i % 2, f"{source}-0-{i}".encode()): 1 for i in range(6)})
    assert [(r["offset"], r["problem"]) for r in result["invalid_sample"]] == [
        (1, "original_partition"),
        (2, "replay_count"),
        (6, "original_partition"),
        (7, "tier"),
    ]


def test_to_a_smaller_first_tier_keyed_records_go_by_key_and_keyless_ones_modulo(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    # setup: a 3-partition source, 2-partition tiers; keyless records from source partitions 0, 1, 2
    source = unique_name("orders")
    topics = _pipeline(kafka, source, 3, 2)
    keys = [b"alpha", b"beta", b"gamma", b"delta"]
    records = [_dlq_record(source, i, 2, key=key) for i, key in enumerate(keys)]
    records += [_dlq_record(source, 10 + p, p, key=None) for p in range(3)]
    produce(kafka, topics.dlq, records)
    probe = unique_name("probe")  # where the producer's partitioner puts each key among 2 partitions
    create_topics(kafka, (probe, 2))
    producer = make_producer(kafka)
    for key in keys:
        producer.produce(probe, key=key, value=b"")
    assert producer.flush(30) == 0
    by_key = {r[2]: r[0] for r in read_direct(kafka, probe, 2)}

    # when
    result = replay(spark, kafka, topics, replay_id="to-tier", destination="first_tier")

    # then
    assert (result["written"], result["skipped_invalid"]) == (7, 0)
    expected = {(by_key[key], f"{source}-0-{i}".encode()): 1 for i, key in enumerate(keys)}
    expected |= {(p % 2, f"{source}-0-{10 + p}".encode()): 1 for p in range(3)}
    assert _origins(kafka, topics.tiers[0].topic, 2, "to-tier") == Counter(expected)


def _one_dlq_record(kafka: KafkaConfig, source: str) -> TopicSet:
    topics = _pipeline(kafka, source, 1, 1)
    produce(kafka, topics.dlq, [_dlq_record(source, 0, 0)])
    return topics


@pytest.mark.parametrize(
    "where",
    [
        "reflect('java.lang.System', 'getProperty', 'user.home') IS NOT NULL",
        "java_method('java.lang.System', 'getenv', 'HOME') IS NOT NULL",
        "raise_error(exception_message) IS NULL",
        "CAST(exception_message AS INT) = 1",
    ],
)
def test_where_refuses_anything_but_a_filter_over_the_typed_columns(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str], where: str
) -> None:
    topics = _one_dlq_record(kafka, unique_name("orders"))

    with pytest.raises(ConfigError, match="where"):
        replay(spark, kafka, topics, replay_id="w", where=where, dry_run=True)


def test_where_selects_by_a_filter_over_the_typed_columns(
    spark: SparkSession, kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """The filter the refusals above are measured against (one Spark job for all of them: a refused clause
    reads nothing): comparisons, IN with a quoted quote, lower() and LIKE select the record."""
    topics = _one_dlq_record(kafka, unique_name("orders"))

    allowed = "original_offset = 0 AND exception_message IN ('boom', 'it''s') AND lower(dlq_reason) LIKE 'exh%'"
    assert replay(spark, kafka, topics, replay_id="w", where=allowed, dry_run=True)["selected"] == 1


CLI = str(Path(sys.executable).with_name("retrytopics"))
_JVM_NOTICE = "WARNING: Using incubator modules: jdk.incubator.vector"
_NOISE = re.compile(r"log4j|\bWARN\b|\bINFO\b|Warning|NativeCodeLoader|setLogLevel|SPARK_LOCAL_IP")


@dataclass(frozen=True)
class ReplayCommand:
    """The `retrytopics replay` command run as a user runs it, its output in `out` and `err`."""

    process: subprocess.Popen[bytes]
    out: Path
    err: Path


@pytest.fixture(scope="module", autouse=True)
def replay_command(kafka: KafkaConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplayCommand]:
    """Starts, as the module starts, the command of the CLI test on a DLQ with a forged partition among valid
    records: its own Spark driver takes the longest to boot, which then overlaps the module's other tests."""
    source = f"orders-cli-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    topics = _pipeline(kafka, source, 2, 2)
    produce(kafka, topics.dlq, [_dlq_record(source, 0, 0), _dlq_record(source, 1, 999), _dlq_record(source, 2, 1)])
    pipeline = ["--bootstrap", kafka.bootstrap, "--topic", source, "--group", "billing", "--delays", "1s,10s"]
    folder = tmp_path_factory.mktemp("replay-command")
    out, err = folder / "stdout", folder / "stderr"
    argv = [CLI, "replay", *pipeline, "--replay-id", "cli-1", "--json", "--log-level", "ERROR", "--master", "local[1]"]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=cli_env())
    yield ReplayCommand(process, out, err)
    if process.poll() is None:  # the CLI test did not run or timed out: stop the command all the same
        process.kill()
        process.wait()


def test_the_replay_command_skips_a_forged_record_finishes_and_prints_no_jvm_noise(
    replay_command: ReplayCommand,
) -> None:
    # setup: a DLQ with a forged partition among valid records, the replay command as a user runs it
    # (started with the module, `replay_command`)

    # when
    replay_command.process.wait(timeout=300)
    stdout, stderr = replay_command.out.read_text(), replay_command.err.read_text()

    # then: exit 0, the forged record counted, and nothing on stderr from the JVM, log4j or pandas
    assert replay_command.process.returncode == 0, stderr[-3000:]
    result = json.loads(stdout)
    assert (result["written"], result["skipped_invalid_by_problem"]) == (2, {"original_partition": 1})
    noise = [line for line in stderr.splitlines() if _NOISE.search(line)]
    assert noise == [], stderr[-3000:]
    # The one line left is the JVM's own notice for the module Spark adds (`--add-modules`), not a log line.
    rest = [line for line in stderr.splitlines() if line.strip() and not line.startswith(_JVM_NOTICE)]
    assert rest == [], stderr[-3000:]
