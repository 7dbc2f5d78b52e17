"""A local Apache Kafka broker for tests, the demo and benchmarks: the real broker users run.

One JVM runs `kafka.Kafka` in KRaft combined mode (broker + controller, node 1) on free 127.0.0.1 ports,
from jars that Maven resolved into the cache (`retrytopics.connectors.jars`; `scripts/setup.sh` fetches
them). Storage is a temporary folder that survives `kill()` + `start()` (a broker crash and restart keeps
its log) and is deleted by `stop()`::

    with ApacheKafkaBroker() as broker:
        print(broker.bootstrap)          # "127.0.0.1:41377"
        kafka = broker.kafka_config()    # a KafkaConfig for it

Same interface as `EmbeddedBroker` (tansu), so callers pick either by name (`connectors.brokers`).
Settings a single-node test broker needs: replication factor 1 for every internal topic, no initial
rebalance delay, a few partitions for the internal topics (fast creation), a small heap.

`ApacheKafkaBroker(security=BrokerSecurity(...))` turns on SASL_SSL with SCRAM-SHA-512 and the standard
authorizer (`connectors.apache_security`); `kafka_config()` then connects as its super user.
The process lifecycle shared with tansu (spawn, readiness, stop, kill) is in `connectors.broker_process`.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from retrytopics.connectors.apache_security import BrokerSecurity
from retrytopics.connectors.broker_process import BrokerProcess
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.jars import KAFKA_BROKER, KAFKA_VERSION, resolve
from retrytopics.core.errors import BrokerBinaryMissing, BrokerExitedEarly, EmbeddedBrokerError

__all__ = ["BROKER_SETTINGS", "ApacheKafkaBroker", "KRaftNode", "java_major_version", "new_cluster_id"]

#: server.properties for a single-node development broker, beyond listeners and storage.
BROKER_SETTINGS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    # The broker talks to itself (transaction markers, ...) on its own listener, so that a fault proxy in
    # front of the client listener cuts clients only.
    "inter.broker.listener.name": "INTERNAL",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # Share groups are on by default since 4.2; these lower bounds let a test group set a short record lock and
    # heartbeat (Kafka's minimums, 15 s and 5 s, would make every lock-expiry test wait that long).
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.min.heartbeat.interval.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "num.partitions": "1",
    "log.segment.bytes": str(64 * 1024 * 1024),
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
}

_LOG4J2 = """\
status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def java_major_version(java: str = "java") -> int:
    """The major version of `java` on PATH, 0 when there is none."""
    if shutil.which(java) is None:
        return 0
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    for line in result.stderr.splitlines():
        if "version" in line and '"' in line:
            number = line.split('"')[1].split(".")
            return int(number[1] if number[0] == "1" else number[0])
    return 0


def new_cluster_id() -> str:
    """A random KRaft cluster id (the storage of every node of one cluster is formatted with the same)."""
    # base64url may start with "-", which the storage tool's argument parser reads as an option (1 in 64)
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


@dataclass(frozen=True, slots=True, kw_only=True)
class KRaftNode:
    """One node of a multi-node KRaft quorum: its id, the quorum it votes in (`controller.quorum.voters`,
    `1@127.0.0.1:9093,2@...`), the cluster id all its peers were formatted with, and the ports its peers
    already know it by (they are in `voters`, so they are chosen before any node starts)."""

    node_id: int
    voters: str
    cluster_id: str
    controller_port: int
    internal_port: int


class ApacheKafkaBroker(BrokerProcess):
    """Start Apache Kafka (KRaft), wait until it answers metadata, stop it on exit, also on exceptions.

    `advertised_port` lets a test put a TCP proxy in front of the broker: clients then reconnect through
    the proxy, because Kafka clients always follow the advertised address. `settings` overrides entries of
    `BROKER_SETTINGS` (e.g. `{"message.max.bytes": "200000"}`). `security` makes the client and
    inter-broker listeners SASL_SSL with SCRAM users and ACLs (see `connectors.apache_security`)."""

    kind = "apache"
    product = "Apache Kafka"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        advertised_port: int | None = None,
        startup_timeout_s: float = 120.0,  # a JVM's start on a busy 2-core machine can take over a minute
        version: str = KAFKA_VERSION,
        heap: str = "512m",
        settings: dict[str, str] | None = None,
        log_level: str = "WARN",
        security: BrokerSecurity | None = None,
        node: KRaftNode | None = None,
    ) -> None:
        self._home = Path(tempfile.mkdtemp(prefix="retrytopics-kafka-"))
        super().__init__(
            host=host,
            port=port,
            advertised_port=advertised_port,
            startup_timeout_s=startup_timeout_s,
            log_path=self._home / "broker.log",
        )
        self.version = version
        self.heap = heap
        self.security = security
        # the client listener is named for its protocol, as Kafka's own examples do
        self.listener = "SASL_SSL" if security else "PLAINTEXT"
        protocols = {"listener.security.protocol.map": "SASL_SSL:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT"}
        secured = {**protocols, **security.server_properties((self.listener, "INTERNAL"))} if security else {}
        self.settings = {**BROKER_SETTINGS, **secured, **(settings or {})}
        self.log_level = log_level
        #: this node's place in a multi-node quorum (`connectors.cluster`); None: a quorum of one, node 1
        self.node = node
        self.controller_port: int | None = node.controller_port if node else None
        self.internal_port: int | None = node.internal_port if node else None
        self._formatted = False

    @property
    def description(self) -> str:
        return f"Apache Kafka {self.version} (KRaft, one node, on this machine)"

    def kafka_config(self, **fields: object) -> KafkaConfig:
        """A KafkaConfig for this broker; Apache Kafka needs no client workaround. A secured broker's connects
        as its super user unless `fields` say otherwise (`**security.client_fields("billing")`)."""
        if self.security is not None and "security_protocol" not in fields:
            fields = {**self.security.client_fields(self.security.admin), **fields}
        return KafkaConfig(bootstrap=self.bootstrap, **fields)  # type: ignore[arg-type]

    @property
    def home(self) -> Path:
        """The folder holding this node's configuration, log file and data (`data/`)."""
        return self._home

    def start(self) -> ApacheKafkaBroker:
        self.launch()
        self.await_ready()
        return self

    def launch(self) -> None:
        """Format the storage (first start only) and spawn the JVM without waiting for it: the nodes of a
        quorum must all be starting before any of them can elect a controller and answer."""
        if self._process is not None:
            raise EmbeddedBrokerError("the broker is already running")
        java = self._java()
        jars = resolve(KAFKA_BROKER, self.version)
        self._home.mkdir(parents=True, exist_ok=True)
        self._choose_ports()
        self._write_config()
        classpath = str(jars / "*")
        if not self._formatted:
            self._format(java, classpath)
        self._spawn(
            [java, *self._jvm_options(), "-cp", classpath, "kafka.Kafka", str(self._home / "server.properties")]
        )

    def await_ready(self) -> None:
        """Wait until the launched broker lists itself in a metadata answer (see `_await_metadata`)."""
        # Straight to the listener, not the advertised port: a proxy in front may not be running yet.
        fields = self.security.client_fields(self.security.admin) if self.security else {}
        listener = KafkaConfig(bootstrap=f"{self.host}:{self.port}", **fields)  # type: ignore[arg-type]
        self._await_metadata(listener.client_config(), f"{self.host}:{self.port} or {self.controller_port}")

    def _java(self) -> str:
        if java_major_version() < 17:
            raise BrokerBinaryMissing(
                "Apache Kafka 4 needs Java 17 or newer on PATH (Debian: apt-get install openjdk-17-jre-headless; "
                "scripts/setup.sh installs it)"
            )
        return "java"

    def _choose_ports(self) -> None:
        self.port = self._claim_port(self.port)
        self.controller_port = self._claim_port(self.controller_port)
        self.internal_port = self._claim_port(self.internal_port)

    def _write_config(self) -> None:
        listeners = {
            "listeners": f"{self.listener}://{self.host}:{self.port},INTERNAL://{self.host}:{self.internal_port},"
            f"CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"{self.listener}://{self.host}:{self.advertised_port or self.port},"
            f"INTERNAL://{self.host}:{self.internal_port}",
            "controller.quorum.voters": self.node.voters if self.node else f"1@{self.host}:{self.controller_port}",
            "log.dirs": str(self._home / "data"),
            **({"node.id": str(self.node.node_id)} if self.node else {}),
        }
        lines = [f"{key}={value}" for key, value in {**self.settings, **listeners}.items()]
        (self._home / "server.properties").write_text("\n".join(lines) + "\n")
        (self._home / "log4j2.properties").write_text(_LOG4J2.format(level=self.log_level))

    def _jvm_options(self) -> list[str]:
        return [
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self._home}",
        ]

    def _format(self, java: str, classpath: str) -> None:
        command = [
            java,
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            f"-Dlog4j2.configurationFile={self._home / 'log4j2.properties'}",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(self._home / "server.properties"),
            "--cluster-id",
            self.node.cluster_id if self.node else new_cluster_id(),
            "--ignore-formatted",
            *(self.security.format_arguments() if self.security else []),
        ]
        result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        if result.returncode != 0:
            output = result.stdout + result.stderr
            for password in self.security.users.values() if self.security else ():
                output = output.replace(password, "[hidden]")  # the tool may echo a --add-scram argument
            raise BrokerExitedEarly("formatting the KRaft storage failed", output[-3000:])
        self._formatted = True

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the broker (controlled shutdown), reap it and delete its storage; idempotent."""
        self._terminate(timeout_s)
        shutil.rmtree(self._home, ignore_errors=True)
        self._formatted = False

    def shut_down(self, timeout_s: float = 30.0) -> None:
        """Stop the broker the clean way (SIGTERM: a controlled shutdown) and keep its storage: `start()`
        brings it back with its data, as after a rolling restart's step."""
        self._terminate(timeout_s)

    def kill(self) -> None:
        """SIGKILL the broker (for fault tests). Its log stays on disk: `start()` brings it back with its data
        on the same ports."""
        super().kill()
