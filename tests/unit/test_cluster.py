"""Guarantee: the 3-node cluster's configuration is one quorum: every node lists every voter, has its own
id, ports and log dir, and replicates what it stores three times, acknowledged by two; the active controller
is read from the newest quorum state, never from a dead node's stale one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from retrytopics.connectors.apache import ApacheKafkaBroker
from retrytopics.connectors.brokers import BROKER_NAMES, local_broker
from retrytopics.connectors.cluster import (
    CLUSTER_SETTINGS,
    KafkaCluster,
    active_controller,
    cluster_nodes,
    quorum_voters,
    unsettled,
)


def _properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def test_every_node_votes_in_one_quorum_with_ports_and_storage_of_its_own() -> None:
    nodes = cluster_nodes("127.0.0.1", [9101, 9102, 9103], [9201, 9202, 9203], "cluster-a")
    brokers = [ApacheKafkaBroker(node=node, port=9300 + node.node_id, settings=CLUSTER_SETTINGS) for node in nodes]
    try:
        written = []
        for broker in brokers:
            broker._choose_ports()
            broker._write_config()
            written.append(_properties(broker.home / "server.properties"))
    finally:
        for broker in brokers:
            broker.stop()

    assert [p["node.id"] for p in written] == ["1", "2", "3"]
    assert {p["controller.quorum.voters"] for p in written} == {"1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"}
    assert [p["listeners"] for p in written] == [
        f"PLAINTEXT://127.0.0.1:{9300 + i},INTERNAL://127.0.0.1:{9200 + i},CONTROLLER://127.0.0.1:{9100 + i}"
        for i in (1, 2, 3)
    ]
    assert len({p["log.dirs"] for p in written}) == 3
    for p in written:
        assert (p["default.replication.factor"], p["min.insync.replicas"]) == ("3", "2")
        assert (p["offsets.topic.replication.factor"], p["transaction.state.log.replication.factor"]) == ("3", "3")
        assert p["transaction.state.log.min.isr"] == "2"
        assert p["process.roles"] == "broker,controller"


def test_a_single_node_keeps_its_quorum_of_one() -> None:
    broker = ApacheKafkaBroker(port=9311)
    try:
        broker._choose_ports()
        broker._write_config()
        written = _properties(broker.home / "server.properties")
    finally:
        broker.stop()
    assert written["node.id"] == "1"
    assert written["controller.quorum.voters"] == f"1@127.0.0.1:{broker.controller_port}"
    assert written["offsets.topic.replication.factor"] == "1"


def test_nodes_are_numbered_from_one_and_share_the_cluster_id() -> None:
    nodes = cluster_nodes("10.0.0.1", [1, 2], [3, 4], "abc")
    assert [(n.node_id, n.controller_port, n.internal_port, n.cluster_id) for n in nodes] == [
        (1, 1, 3, "abc"),
        (2, 2, 4, "abc"),
    ]
    assert quorum_voters("10.0.0.1", [1, 2]) == "1@10.0.0.1:1,2@10.0.0.1:2"


@pytest.mark.parametrize(("controllers", "internals"), [([], []), ([1, 2], [3]), ([1, 1], [3, 4]), ([1, 2], [2, 3])])
def test_missing_or_shared_ports_are_refused(controllers: list[int], internals: list[int]) -> None:
    with pytest.raises(ValueError):
        cluster_nodes("127.0.0.1", controllers, internals, "abc")


def test_the_active_controller_is_the_leader_of_the_newest_epoch() -> None:
    stale = {"leaderId": 1, "leaderEpoch": 3}  # a killed node still names itself
    current = {"leaderId": 2, "leaderEpoch": 4}
    assert active_controller([stale, current, current]) == 2
    assert active_controller([current, stale]) == 2
    assert active_controller([stale, {"leaderId": -1, "leaderEpoch": 5, "votedId": 3}]) is None  # electing
    assert active_controller([]) is None
    assert active_controller([{"leaderEpoch": 2}]) is None


def test_the_cluster_is_selectable_by_name_and_refuses_a_fixed_port() -> None:
    assert "cluster" in BROKER_NAMES
    cluster = local_broker("cluster")
    assert isinstance(cluster, KafkaCluster) and cluster.kind == "cluster" and cluster.port is None
    with pytest.raises(ValueError, match="ports"):
        local_broker("cluster", port=9092)
    with pytest.raises(ValueError):
        KafkaCluster(size=0)


def _metadata(brokers: int, partitions: dict[int, tuple[int, list[int], list[int]]], error: object = None) -> object:
    """A `list_topics()` answer: `partitions` maps a number to (leader, replicas, in-sync replicas)."""
    topic = SimpleNamespace(
        error=error,
        partitions={p: SimpleNamespace(leader=lead, replicas=r, isrs=i) for p, (lead, r, i) in partitions.items()},
    )
    return SimpleNamespace(brokers=dict.fromkeys(range(1, brokers + 1)), topics={"orders": topic})


def test_a_cluster_is_settled_only_with_every_node_live_and_every_partition_led_and_in_sync() -> None:
    full = [1, 2, 3]
    assert unsettled(_metadata(3, {0: (1, full, full), 1: (2, full, [2, 3, 1])}), 3) == []
    assert unsettled(_metadata(2, {0: (1, full, full)}), 3) == ["2 of 3 brokers live"]
    assert unsettled(_metadata(3, {0: (-1, full, [1]), 1: (3, full, [3, 1])}), 3) == [
        "orders[0] has no leader",
        "orders[1] has 2 of 3 in sync",
    ]
    assert unsettled(_metadata(3, {}, error="UNKNOWN_TOPIC_OR_PART"), 3) == ["orders: UNKNOWN_TOPIC_OR_PART"]
