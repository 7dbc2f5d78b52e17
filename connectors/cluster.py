"""A local 3-node Apache Kafka cluster for failover tests, the demo and benchmarks.

Three JVMs, each an `ApacheKafkaBroker` in KRaft combined mode (broker + controller) with its own log dir,
free 127.0.0.1 ports and a small heap, voting in one 3-voter quorum. Internal topics and new topics get
replication factor 3 and `min.insync.replicas=2`, as a production cluster that survives one broker should::

    with KafkaCluster() as cluster:
        kafka = cluster.kafka_config()           # bootstrap: all three nodes
        leader = cluster.leader_of("orders", 0)  # node id
        cluster.kill(leader)                     # SIGKILL; its log stays on disk
        cluster.restart(leader)                  # back on the same ports with its data
        cluster.freeze(cluster.active_controller())  # SIGSTOP, then thaw(...) sends SIGCONT

Kafka's own failure-detection settings are left at their defaults (`broker.session.timeout.ms` 9 s, ...):
what a failover costs here is what it costs on a real cluster with default settings.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from retrytopics.connectors.apache import ApacheKafkaBroker, KRaftNode, new_cluster_id
from retrytopics.connectors.broker_process import free_port
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.jars import KAFKA_VERSION
from retrytopics.core.errors import BrokerExitedEarly, EmbeddedBrokerError

__all__ = [
    "CLUSTER_SETTINGS",
    "KafkaCluster",
    "active_controller",
    "cluster_nodes",
    "quorum_voters",
    "unsettled",
]

#: server.properties entries of every node beyond a single node's (`apache.BROKER_SETTINGS`): everything
#: replicated three times and acknowledged by two, so one node may fail without losing or refusing writes.
CLUSTER_SETTINGS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
}

_QUORUM_STATE = Path("__cluster_metadata-0") / "quorum-state"


def quorum_voters(host: str, controller_ports: Sequence[int]) -> str:
    """`controller.quorum.voters` for nodes 1..n listening for controllers on `controller_ports`."""
    return ",".join(f"{node_id}@{host}:{port}" for node_id, port in enumerate(controller_ports, start=1))


def cluster_nodes(
    host: str, controller_ports: Sequence[int], internal_ports: Sequence[int], cluster_id: str
) -> list[KRaftNode]:
    """The nodes of one quorum, ids 1..n: every node knows every voter's controller port from the start."""
    if len(controller_ports) != len(internal_ports) or not controller_ports:
        raise ValueError("one controller port and one internal port per node, at least one node")
    if len(set(controller_ports) | set(internal_ports)) != 2 * len(controller_ports):
        raise ValueError("every node needs ports of its own")
    voters = quorum_voters(host, controller_ports)
    return [
        KRaftNode(node_id=i, voters=voters, cluster_id=cluster_id, controller_port=c, internal_port=b)
        for i, (c, b) in enumerate(zip(controller_ports, internal_ports, strict=True), start=1)
    ]


def active_controller(quorum_states: Iterable[Mapping[str, Any]]) -> int | None:
    """The active controller by the nodes' persisted quorum states (the newest epoch wins: a dead or frozen
    node's file keeps the leader it last knew); None while an election is under way or nothing is known."""
    newest: Mapping[str, Any] | None = None
    for state in quorum_states:
        if newest is None or int(state.get("leaderEpoch", -1)) > int(newest.get("leaderEpoch", -1)):
            newest = state
    leader = int(newest.get("leaderId", -1)) if newest is not None else -1
    return leader if leader > 0 else None


def unsettled(metadata: Any, size: int) -> list[str]:
    """What keeps one node's metadata (`list_topics()`'s answer) from a settled cluster of `size` nodes: fewer
    live brokers, a topic in error, a partition without a leader or with a replica out of sync. Empty when
    settled: a test started then meets no fault left over by the previous one."""
    live = len(metadata.brokers)
    problems = [] if live >= size else [f"{live} of {size} brokers live"]
    for name, topic in sorted(metadata.topics.items()):
        if topic.error is not None:
            problems.append(f"{name}: {topic.error}")
            continue
        for number, partition in sorted(topic.partitions.items()):
            if partition.leader < 0:
                problems.append(f"{name}[{number}] has no leader")
            elif len(partition.isrs) < len(partition.replicas):
                problems.append(f"{name}[{number}] has {len(partition.isrs)} of {len(partition.replicas)} in sync")
    return problems


class KafkaCluster:
    """Start three Apache Kafka nodes in one KRaft quorum; stop them on exit, also on exceptions.

    Same interface as a single broker where it makes sense (`connectors.brokers.LocalBroker`), so the demo
    and the benchmarks take it by name ("cluster"); `kill()` without a node id kills every node."""

    kind = "cluster"
    product = "Apache Kafka cluster"

    def __init__(
        self,
        *,
        size: int = 3,
        host: str = "127.0.0.1",
        heap: str = "384m",
        settings: Mapping[str, str] | None = None,
        startup_timeout_s: float = 90.0,
        version: str = KAFKA_VERSION,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one node")
        self.size = size
        self.host = host
        self.version = version
        self.startup_timeout_s = startup_timeout_s
        self._settings = {**CLUSTER_SETTINGS, **(settings or {})}
        self._heap = heap
        self._nodes: dict[int, ApacheKafkaBroker] = {}
        self._frozen: set[int] = set()

    # -- the LocalBroker interface --------------------------------------------------------------------------

    @property
    def description(self) -> str:
        return f"Apache Kafka {self.version} (KRaft, {self.size} nodes, {self.size}-voter quorum, on this machine)"

    @property
    def bootstrap(self) -> str:
        if not self._nodes:
            raise EmbeddedBrokerError("the cluster has not been started")
        return ",".join(f"{self.host}:{node.port}" for node in self._nodes.values())

    @property
    def port(self) -> int | None:
        return self._nodes[1].port if self._nodes else None

    @property
    def pid(self) -> int | None:
        return self._nodes[1].pid if self._nodes else None

    @property
    def log_path(self) -> Path:
        if not self._nodes:
            raise EmbeddedBrokerError("the cluster has not been started")
        return self._nodes[1].log_path

    def kafka_config(self, **fields: object) -> KafkaConfig:
        """A KafkaConfig whose bootstrap lists every node: a client starts even while one is down."""
        return KafkaConfig(bootstrap=self.bootstrap, **fields)  # type: ignore[arg-type]

    def start(self) -> Self:
        if self._nodes:
            raise EmbeddedBrokerError("the cluster is already running")
        ports = [[free_port(self.host) for _ in range(self.size)] for _ in range(2)]
        nodes = cluster_nodes(self.host, ports[0], ports[1], new_cluster_id())
        for node in nodes:
            self._nodes[node.node_id] = ApacheKafkaBroker(
                host=self.host,
                heap=self._heap,
                settings=dict(self._settings),
                node=node,
                startup_timeout_s=self.startup_timeout_s,
                version=self.version,
            )
        try:
            for broker in self._nodes.values():  # all at once: no node answers before a quorum elects
                broker.launch()
            for broker in self._nodes.values():
                broker.await_ready()
            self.await_brokers(self.size, self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (thawing frozen ones first, so that they can shut down) and delete their storage."""
        for node_id in list(self._frozen):
            self.thaw(node_id)
        # all at once: a node stopping alone waits for a quorum that the others, stopping after it, still form
        stopping = [threading.Thread(target=broker.stop) for broker in self._nodes.values()]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        self._nodes.clear()

    def kill(self, node_id: int | None = None) -> None:
        """SIGKILL one node (its log stays: `restart(node_id)` brings it back), or every node when None."""
        for target in [node_id] if node_id is not None else list(self._nodes):
            self._frozen.discard(target)
            self.node(target).kill()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(f"--- node {i}\n{b.log_tail(lines)}" for i, b in self._nodes.items())

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- faults ---------------------------------------------------------------------------------------------

    def node(self, node_id: int) -> ApacheKafkaBroker:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise EmbeddedBrokerError(f"no node {node_id}; nodes: {sorted(self._nodes)}") from None

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._nodes)

    def shut_down(self, node_id: int, timeout_s: float = 30.0) -> None:
        """Stop one node the clean way (SIGTERM: controlled shutdown, leadership moved first); its log stays."""
        self._frozen.discard(node_id)
        self.node(node_id).shut_down(timeout_s)

    def restart(self, node_id: int) -> None:
        """Start a killed (or stopped by `kill`) node again with its data, on its ports; waits until it answers."""
        self.node(node_id).start()

    def freeze(self, node_id: int) -> None:
        """SIGSTOP one node: its sockets stay open and nothing answers (a long GC pause, a hung host)."""
        self._signal(node_id, signal.SIGSTOP)
        self._frozen.add(node_id)

    def thaw(self, node_id: int) -> None:
        """SIGCONT a frozen node."""
        self._signal(node_id, signal.SIGCONT)
        self._frozen.discard(node_id)

    def heal(self, timeout_s: float = 60.0) -> None:
        """Thaw every frozen node, restart every stopped one, and wait until all are registered again."""
        for node_id in list(self._frozen):
            self.thaw(node_id)
        for node_id, broker in self._nodes.items():
            if broker.pid is None:
                self.restart(node_id)
        self.await_brokers(len(self._nodes), timeout_s)

    def _signal(self, node_id: int, sig: signal.Signals) -> None:
        pid = self.node(node_id).pid
        if pid is None:
            raise EmbeddedBrokerError(f"node {node_id} is not running")
        os.kill(pid, sig)

    # -- who leads ------------------------------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int, *, timeout_s: float = 30.0) -> int:
        """The node id leading `topic`'s `partition` (asked of the running nodes, each ask bounded so that one
        node still busy after the previous fault cannot use the whole deadline)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ask_s = max(0.5, min(3.0, deadline - time.monotonic()))
                meta = self._admin().list_topics(topic, timeout=ask_s).topics.get(topic)
            except Exception:  # noqa: BLE001 - a node just frozen or restarting may not answer; the deadline bounds it
                meta = None
            if meta is not None and partition in meta.partitions and meta.partitions[partition].leader > 0:
                return int(meta.partitions[partition].leader)
            if time.monotonic() > deadline:
                raise EmbeddedBrokerError(
                    f"{topic}[{partition}] has no leader after {timeout_s}s; the nodes say: "
                    f"{'; '.join(self._node_problems()[:10]) or 'settled'}\n{self.log_tail(10)}"
                )
            time.sleep(0.1)

    def active_controller(self) -> int | None:
        """The node id of the active controller, from the quorum state each node persists on every change."""
        states = []
        for broker in self._nodes.values():
            try:
                states.append(json.loads((broker.home / "data" / _QUORUM_STATE).read_text()))
            except (OSError, ValueError):
                continue  # not written yet, or being replaced
        return active_controller(states)

    def await_brokers(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until the cluster's metadata lists `count` live brokers (a restarted node registered again)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if len(self._admin().list_topics(timeout=2).brokers) >= count:
                    return
            except Exception:  # noqa: BLE001 - no node answers yet; the deadline bounds the loop
                pass
            if time.monotonic() > deadline:
                raise BrokerExitedEarly(
                    f"the cluster did not list {count} brokers within {timeout_s}s", self.log_tail(10)
                )
            time.sleep(0.1)

    def await_in_sync(self, topics: Iterable[str] | None = None, timeout_s: float = 60.0) -> None:
        """Wait until every partition of `topics` (default: every topic) has a leader and all its replicas in sync (before
        the next step of a rolling restart: taking a node while another catches up would drop partitions
        below `min.insync.replicas`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                metadata = self._admin().list_topics(timeout=5).topics
            except Exception:  # noqa: BLE001 - a node restarting may not answer yet; the deadline bounds the loop
                metadata = None
            names = list(metadata or ()) if topics is None else list(topics)
            lagging = (
                [
                    f"{name}[{p}]"
                    for name in names
                    for p, meta in metadata[name].partitions.items()
                    if meta.leader < 0 or len(meta.isrs) < len(meta.replicas)
                ]
                if metadata is not None and all(name in metadata for name in names)
                else names or ["(no metadata)"]
            )
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise EmbeddedBrokerError(
                    f"partitions not in sync after {timeout_s}s: {lagging[:10]}\n{self.log_tail(10)}"
                )
            time.sleep(0.2)

    def await_settled(self, timeout_s: float = 120.0) -> None:
        """Wait until every node answers that every node is live and every partition of every topic has a leader
        and all its replicas in sync (`unsettled`). Each node is asked alone: a node that restarted or thawed
        may still serve an older view of the cluster than the others."""
        deadline = time.monotonic() + timeout_s
        while problems := self._node_problems():
            if time.monotonic() > deadline:
                raise EmbeddedBrokerError(
                    f"the cluster did not settle within {timeout_s}s: {problems[:10]}\n{self.log_tail(10)}"
                )
            time.sleep(0.5)

    def _node_problems(self) -> list[str]:
        problems = []
        for node_id, broker in self._nodes.items():
            try:
                metadata = self._admin(f"{self.host}:{broker.port}").list_topics(timeout=3)
            except Exception as exc:  # noqa: BLE001 - a node that does not answer is one of the problems
                problems.append(f"node {node_id}: no answer ({exc})")
                continue
            problems += [f"node {node_id}: {problem}" for problem in unsettled(metadata, self.size)]
        return problems

    def _admin(self, bootstrap: str | None = None) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": bootstrap or self.bootstrap, "log_level": 0})
