"""Guarantees of the key-state topic's operator side on Apache Kafka (docs/key-ordering.md, section 5):

- the preflight of a key-ordered app refuses a key-state topic the broker keeps with `cleanup.policy=delete`
  (as Kafka reports it), naming the topic and the fix, and passes on the one `provision()` makes;
- `topics describe` of a key-ordered pipeline shows its open chains per source partition, from the live chain
  records by compaction's rule (a tombstone closes a chain, a later record replaces an earlier one), counts
  malformed records without trusting them, and prints key ids in hex, never a long key's bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from retrytopics import ConfigError, KafkaConfig, KeyOrdering, RetryApp, RetryPolicy
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.state_records import Chain, Closed, Fate, Passage, encode_record

pytestmark = pytest.mark.broker
CLI = str(Path(sys.executable).with_name("retrytopics"))
LONG_KEY = b"customer-" + b"x" * 40  # longer than 32 bytes: shown by its digest only


def test_preflight_refuses_a_key_state_topic_kafka_keeps_with_delete_and_passes_once_compacted(
    kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """A key-state topic created with `cleanup.policy=delete` fails the preflight with the policy, the topic and
    the fix named; another app of the same source whose topic `provision()` made compacted passes."""
    source = unique_name("orders")
    ensure_topics(make_admin(kafka), [TopicSpec(name=source, partitions=2)])
    deleting = RetryApp(kafka=kafka, group="deleting")
    deleting.handler(source, policy=RetryPolicy(delays=["1s"]), ordering=KeyOrdering())(lambda record: None)
    keys = deleting.topics(source).key_state_topic
    ensure_topics(make_admin(kafka), [TopicSpec(name=keys, partitions=2, config={"cleanup.policy": "delete"})])

    with pytest.raises(ConfigError) as info:
        deleting.preflight()
    assert (info.value.field, info.value.value) == ("key_state_topic", keys)
    assert "cleanup.policy=delete, not compact" in str(info.value)

    provisioned = RetryApp(kafka=kafka, group="provisioned")
    provisioned.handler(source, policy=RetryPolicy(delays=["1s"]), ordering=KeyOrdering())(lambda record: None)
    with pytest.raises(ConfigError, match="does not exist"):
        provisioned.preflight()
    provisioned.provision()
    provisioned.preflight()


def _describe(kafka: KafkaConfig, source: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["topics", "describe", "--bootstrap", kafka.bootstrap, "--topic", source, "--group", "billing"]
    env = {**os.environ, "RETRYTOPICS_APP_KEY_ORDERING": "true"}
    return subprocess.run([CLI, *args, "--delays", "1s", *extra], capture_output=True, text=True, timeout=60, env=env)


def test_topics_describe_shows_open_chains_per_source_partition(
    kafka: KafkaConfig, unique_name: Callable[[str], str]
) -> None:
    """Partition 0 has two open chains (one rewritten by a later chain record, one of a long key), one closed
    by its tombstone; partition 1 one open chain. A passage is not a chain; a record that does not decode and a
    chain record written to the wrong partition are counted as malformed. JSON and text agree; the text names
    the long key by its `01` digest id and never prints its bytes."""
    source = unique_name("orders")
    group = "billing"
    ensure_topics(make_admin(kafka), [TopicSpec(name=source, partitions=2)])
    created = subprocess.run(
        [
            CLI,
            "topics",
            "create",
            "--bootstrap",
            kafka.bootstrap,
            "--topic",
            source,
            "--group",
            group,
            "--delays",
            "1s",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RETRYTOPICS_APP_KEY_ORDERING": "true"},
    )
    assert created.returncode == 0, created.stderr
    keys_topic = f"{source}.{group}.keys"

    def chain(partition: int, key: bytes, head: int, frontier: int, followers: int) -> Chain:
        return Chain(
            chain=ChainKey(source, partition, key_id(key)),
            head=head,
            frontier=frontier,
            at_tier=0,
            followers=followers,
            since_ms=1_800_000_000_000 + head,
        )

    records = [
        chain(0, b"acct-7", 10, 10, 0),
        chain(0, b"acct-8", 11, 11, 0),
        chain(0, b"acct-7", 10, 14, 2),  # the same chain, extended: replaces the first
        Closed(chain=ChainKey(source, 0, key_id(b"acct-8"))),  # acct-8's chain closed
        chain(0, LONG_KEY, 20, 20, 0),
        chain(1, b"acct-9", 3, 5, 1),
        Passage(tier=0, chain=ChainKey(source, 1, key_id(b"acct-9")), seen=3, fate=Fate.SENT, to_tier=0, after=3),
    ]
    producer = make_producer(kafka)
    for record in records:
        key, value, partition = encode_record(record)
        producer.produce(keys_topic, key=key, value=value, partition=partition)
    forged_key, forged_value, _ = encode_record(chain(0, b"acct-1", 1, 1, 0))
    producer.produce(keys_topic, key=forged_key, value=forged_value, partition=1)  # not its source partition
    producer.produce(keys_topic, key=f"chain/{source}/0/0061".encode(), value=b'{"v":1,"head":"x"}', partition=0)
    assert producer.flush(30) == 0

    as_json = _describe(kafka, source, "--json")
    as_text = _describe(kafka, source)

    assert as_json.returncode == 0, as_json.stderr
    described = json.loads(as_json.stdout)
    state = described["key_state"]
    assert (state["topic"], state["malformed"], state["blocked_keys"]) == (keys_topic, 2, {"0": 2, "1": 1})
    open_chains = {(c["partition"], c["key_id"]): (c["head"], c["frontier"], c["followers"]) for c in state["chains"]}
    long_id = key_id(LONG_KEY).hex()
    assert open_chains == {
        (0, key_id(b"acct-7").hex()): (10, 14, 2),
        (0, long_id): (20, 20, 0),
        (1, key_id(b"acct-9").hex()): (3, 5, 1),
    }
    sources = {r["partition"]: r["state"] for r in described["partitions"] if r["kind"] == "source"}
    assert sources == {0: "2 blocked keys", 1: "1 blocked key"}
    assert as_text.returncode == 0, as_text.stderr
    assert f"key-state topic {keys_topic}: 3 blocked keys, 2 malformed records skipped" in as_text.stdout
    assert long_id in as_text.stdout and long_id.startswith("01")
    assert LONG_KEY.decode() not in as_text.stdout and LONG_KEY.hex() not in as_text.stdout
