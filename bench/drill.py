"""A failover drill: records produced at a steady rate through a RetryApp on a `KafkaCluster`, a fault
injected mid-run, and a per-id ledger of what happened to every record.

Shared by the failover tests (tests/integration/failover/, which load this file by path and assert on the
`Outcome`) and the benchmark (`python -m bench --only failover`, which reports the stall and lateness).
Standard library, confluent-kafka and retrytopics only: no other bench module, so that it loads anywhere.

Fates by id (`fate(i)`): most succeed at once; one in ten fails once and succeeds on its first tier; one in
twenty is non-retryable (DLQ `non_retryable`), one in twenty always fails (DLQ `exhausted`). The ledger
then says, per id: handled or dead-lettered (none lost), never handled before its due time, dead-lettered
at most once, and in exactly-once mode written to each tier at most once in the read_committed view.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.admin import TopicSpec, committed_offsets, end_offsets, ensure_topics
from retrytopics.connectors.cluster import KafkaCluster
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.headers import HeaderDecodeError, decode
from retrytopics.runtime.handoff.transactional import TransactionOutcomeUnknown

__all__ = [
    "DrillPlan",
    "Outcome",
    "fate",
    "freeze_partition_leader",
    "kill_active_controller",
    "kill_partition_leader",
    "rolling_restart",
    "run_drill",
]

SUCCEED, FAIL_ONCE, NON_RETRYABLE, ALWAYS_FAIL = "succeed", "fail_once", "non_retryable", "always_fail"

#: a fault: (cluster, source topic, app's group) -> what it did, naming the node it took as "(node N, ..."
Fault = Callable[[KafkaCluster, str, str], str]


#: the DLQ reason each dead-lettered fate must carry
_PLANNED_REASON = {NON_RETRYABLE: "non_retryable", ALWAYS_FAIL: "exhausted"}


def fate(i: int) -> str:
    """What the drill's handler does with record `i` (see the module docstring)."""
    if i % 20 == 5:
        return NON_RETRYABLE
    if i % 20 == 15:
        return ALWAYS_FAIL
    return FAIL_ONCE if i % 10 == 1 else SUCCEED


@dataclass(frozen=True, kw_only=True)
class DrillPlan:
    """One drill: `records` produced at `rate_per_s` over `partitions` source partitions, the fault started
    `fault_at_s` after the first record was produced."""

    records: int = 2400
    rate_per_s: float = 200.0
    partitions: int = 3
    delays: tuple[str, ...] = ("1s", "2s")
    exactly_once: bool = False
    consumer_overrides: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    #: more RetryApp keyword arguments (e.g. `commit_interval`)
    app_options: Mapping[str, Any] = field(default_factory=dict)
    fault_at_s: float = 4.0
    timeout_s: float = 180.0


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the ledger says after the drill; the tests assert the counts are 0, the bench reports the times."""

    fault: str
    lost: list[int]  # neither handled nor dead-lettered when the drill's time ran out: lost, or stuck
    early: list[tuple[int, str, int]]  # (id, topic, ms before its due time)
    duplicate_dead_letters: dict[int, int]
    unplanned_dead_letters: list[int]  # dead-lettered although planned to succeed, or with another reason
    committed_tier_duplicates: dict[tuple[int, int], int]  # (id, failures) -> copies in a tier, read_committed
    #: partitions whose running consumer had not committed to their end 20 s after the last id was accounted
    #: for (an asynchronous commit refused during the failover is only retried by a later commit)
    uncommitted_while_running: list[str]
    uncommitted: list[str]  # partitions not committed to their end after the app stopped
    extra_calls: int
    stall_s: float
    max_source_lateness_s: float
    max_source_wait_s: float  # the longest a record sat acknowledged in the source before it was handled
    max_produce_delay_s: float  # the longest the cluster took to acknowledge a source record
    max_tier_lateness_s: float
    coordinator_killed: bool | None
    app_error: str | None = None  # what stopped the app, or that it would not stop
    #: times the app was started again after a transaction of unknown outcome (`_Operated`)
    app_restarts: int = 0

    def summary(self) -> str:
        return (
            f"{self.fault}: stall {self.stall_s:.1f} s, source lateness max {self.max_source_lateness_s:.1f} s "
            f"(produce {self.max_produce_delay_s:.1f} s, waiting in the source {self.max_source_wait_s:.1f} s), "
            f"tier lateness max {self.max_tier_lateness_s:.1f} s, lost {len(self.lost)}, early {len(self.early)}, "
            f"duplicate dead letters {sum(self.duplicate_dead_letters.values())}, unplanned dead letters "
            f"{len(self.unplanned_dead_letters)}, committed tier duplicates {sum(self.committed_tier_duplicates.values())}, "
            f"extra handler calls {self.extra_calls}, partitions behind while running {self.uncommitted_while_running} "
            f"and after the stop {self.uncommitted}, app error: {self.app_error}, app restarts: {self.app_restarts}, "
            f"group coordinator killed: {self.coordinator_killed}"
        )


class _Ledger:
    """Every handler call as the handler saw it, and when each id was produced (wall-clock ms)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[int, list[tuple[str, int, int, int | None]]] = defaultdict(list)  # topic, failures, at, due
        self.produced_at: dict[int, int] = {}
        self.acked_at: dict[int, int] = {}  # when the cluster acknowledged the record (acks=all)
        self.source_handled: list[int] = []
        self.succeeded: set[int] = set()

    def handle(self, record: Record[int]) -> None:
        now = int(time.time() * 1000)
        i = record.value
        due = record.retry.due_at if record.retry is not None else None
        with self.lock:
            self.calls[i].append((record.topic, record.reconsume_times, now, due))
            if record.retry is None:
                self.source_handled.append(now)
        what = fate(i)
        if what == NON_RETRYABLE:
            raise NonRetryable(ValueError(f"bad {i}"))
        if what == ALWAYS_FAIL or (what == FAIL_ONCE and record.retry is None):
            raise RuntimeError(f"transient {i}")
        with self.lock:
            self.succeeded.add(i)


class _DeadLetters:
    """Reads the DLQ (read_committed) from the start while the drill runs: id -> copies."""

    def __init__(self, kafka: Any, topic: str, partitions: int) -> None:
        self.copies: Counter[int] = Counter()
        self.reasons: dict[int, str] = {}
        self._consumer = make_consumer(kafka, group_id=None)
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="drill-dlq", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(500, 0.2):
                if message.error() is None:
                    i = int(message.value() or b"-1")
                    self.copies[i] += 1
                    try:
                        reason = decode(list(message.headers() or ())).dlq_reason
                        self.reasons[i] = reason.value if reason is not None else "none"
                    except HeaderDecodeError as exc:
                        self.reasons[i] = f"undecodable: {exc}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def _produce(kafka: Any, topic: str, plan: DrillPlan, ledger: _Ledger, started: threading.Event) -> None:
    producer = make_producer(kafka, overrides={"message.timeout.ms": 120_000})
    t0 = time.monotonic()
    for i in range(plan.records):
        pause = t0 + i / plan.rate_per_s - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        ledger.produced_at[i] = int(time.time() * 1000)
        producer.produce(
            topic,
            value=str(i).encode(),
            partition=i % plan.partitions,
            on_delivery=lambda err, _msg, i=i: err or ledger.acked_at.__setitem__(i, int(time.time() * 1000)),
        )
        producer.poll(0)
        started.set()
    if producer.flush(120) != 0:
        raise RuntimeError("the drill's producer could not deliver every record within 120 s")


def kill_partition_leader(restart_after_s: float = 10.0, *, coordinator: bool | None = None) -> Fault:
    """SIGKILL a node leading a source partition, restart it `restart_after_s` later (with its log).
    `coordinator`: True takes the leader that is also the app's group coordinator, False one that is not,
    None the leader of partition 0 whatever it coordinates."""

    def fault(cluster: KafkaCluster, source: str, group: str) -> str:
        leaders = [cluster.leader_of(source, p) for p in range(_partitions(cluster, source))]
        target = leaders[0]
        if coordinator is not None:
            owner = _coordinator(cluster.kafka_config(), group)
            matching = [n for n in leaders if (n == owner) == coordinator]
            if not matching:
                raise RuntimeError(
                    f"no source partition leader that {'is' if coordinator else 'is not'} the coordinator"
                )
            target = matching[0]
        cluster.kill(target)
        time.sleep(restart_after_s)
        cluster.restart(target)
        return f"leader kill (node {target}, restarted after {restart_after_s:.0f} s)"

    return fault


def freeze_partition_leader(frozen_s: float = 20.0) -> Fault:
    """SIGSTOP the node leading source partition 0 for `frozen_s` (a long GC pause, a hung host), then SIGCONT:
    its sockets stay open while nothing answers, and it wakes up fenced, to a cluster that moved on."""

    def fault(cluster: KafkaCluster, source: str, group: str) -> str:
        leader = cluster.leader_of(source, 0)
        cluster.freeze(leader)
        time.sleep(frozen_s)
        cluster.thaw(leader)
        return f"leader frozen (node {leader}, for {frozen_s:.0f} s)"

    return fault


def _partitions(cluster: KafkaCluster, topic: str, timeout_s: float = 60.0) -> int:
    """`topic`'s partition count, asked again until `timeout_s`: on a loaded machine one metadata request
    may time out although every node is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return len(make_admin(cluster.kafka_config()).list_topics(topic, timeout=10).topics[topic].partitions)
        except (KafkaException, KeyError):  # the deadline bounds the loop, then the last error is raised
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def kill_active_controller(restart_after_s: float = 10.0) -> Fault:
    """SIGKILL the active controller, restart it `restart_after_s` later."""

    def fault(cluster: KafkaCluster, source: str, group: str) -> str:
        controller = cluster.active_controller()
        if controller is None:
            raise RuntimeError("no active controller to kill")
        cluster.kill(controller)
        time.sleep(restart_after_s)
        cluster.restart(controller)
        return f"controller kill (node {controller}, restarted after {restart_after_s:.0f} s)"

    return fault


def rolling_restart() -> Fault:
    """Stop and start every node in turn (SIGTERM: a controlled shutdown), each once every partition of the
    cluster is fully in sync again, as an operator's rolling upgrade does."""

    def fault(cluster: KafkaCluster, source: str, group: str) -> str:
        for node_id in cluster.node_ids:
            cluster.await_in_sync(timeout_s=120)
            cluster.shut_down(node_id)
            cluster.restart(node_id)
        cluster.await_in_sync(timeout_s=120)
        return "rolling restart"

    return fault


class _Operated:
    """The drill's RetryApp as an operator runs it: an app that stopped on a transaction of unknown outcome
    (exactly-once: a commit given up at its bound; docs/operations.md, "Bounds") is started again under the
    same instance id, which fences its predecessor's producer, and reads on from the committed offsets. Any
    other error stops the drill, as before."""

    #: more restarts than this end the drill with the app's error
    MAX_RESTARTS = 3

    def __init__(self, kafka: Any, group: str, source: str, plan: DrillPlan, ledger: _Ledger) -> None:
        self._kafka, self._group, self._source, self._plan, self._ledger = kafka, group, source, plan, ledger
        self.restarts = 0
        self.current = self._build(plan.app_options.get("instance_id"))

    def _build(self, instance_id: str | None) -> RetryApp:
        options = {k: v for k, v in self._plan.app_options.items() if k != "instance_id"}
        app = RetryApp(
            kafka=self._kafka,
            group=self._group,
            exactly_once=self._plan.exactly_once,
            consumer_overrides=self._plan.consumer_overrides,
            instance_id=instance_id,
            **options,
        )
        app.handler(
            self._source, policy=RetryPolicy(delays=list(self._plan.delays)), value_deserializer=lambda d, c: int(d)
        )(self._ledger.handle)
        return app

    def restart_if_outcome_unknown(self) -> bool:
        """Start the app again if it stopped on a transaction of unknown outcome; True if it did."""
        if not isinstance(self.current.error, TransactionOutcomeUnknown) or self.restarts >= self.MAX_RESTARTS:
            return False
        if not self.current.stop(timeout=30):
            return False
        self.current = self._build(self.current.instance_id)
        self.current.start(main=True, tiers="all")
        self.restarts += 1
        return True


def run_drill(cluster: KafkaCluster, plan: DrillPlan, fault: Fault, *, name: Callable[[str], str]) -> Outcome:
    """Run one drill on `cluster` (left running, every node up, when this returns). `name(stem)` makes the
    topic and group names unique."""
    kafka = cluster.kafka_config()
    source, group = name("drill"), name("drill-app")
    ensure_topics(make_admin(kafka), [TopicSpec(name=source, partitions=plan.partitions)])
    ledger = _Ledger()
    app = _Operated(kafka, group, source, plan, ledger)
    app.current.provision(partitions=plan.partitions)
    topics = app.current.topics(source)
    # new partitions reach every node's metadata, led and in sync, a moment after their creation
    cluster.await_in_sync([source, *topics.all_topics])
    dead_letters = _DeadLetters(kafka, topics.dlq, plan.partitions)
    started = threading.Event()
    producer = threading.Thread(target=_produce, args=(kafka, source, plan, ledger, started), daemon=True)
    app.current.start(main=True, tiers="all")
    try:
        _await_assignment(app.current, kafka, group, source, plan)
        producer.start()
        started.wait(30)
        time.sleep(plan.fault_at_s)
        coordinator = _coordinator(kafka, group)
        fault_at = time.time()
        described = fault(cluster, source, group)
        killed = _killed_node(described)
        cluster.await_brokers(len(cluster.node_ids), timeout_s=120)
        producer.join(plan.timeout_s)
        running_behind = _await_accounted(ledger, dead_letters, plan, kafka, group, source, topics, app)
    finally:
        stopped = app.current.stop(timeout=30)
        dead_letters.close()
    error = (
        repr(app.current.error)
        if app.current.error is not None
        else None
        if stopped
        else f"did not stop within 30 s: {_stuck(group)}"
    )
    uncommitted = _await_committed(kafka, group, source, topics, plan, time.monotonic() + 15)
    tier_copies = _tier_copies(kafka, [t.topic for t in topics.tiers], plan.partitions) if plan.exactly_once else {}
    outcome = _outcome(
        described,
        ledger,
        dead_letters,
        plan,
        fault_at,
        tier_copies,
        (running_behind, uncommitted),
        None if coordinator is None or killed is None else coordinator == killed,
    )
    return dataclasses.replace(outcome, app_error=error, app_restarts=app.restarts)


def _stuck(group: str) -> str:
    """Where each consumer thread of the app that would not stop is (its innermost frames of our code)."""
    frames = sys._current_frames()
    stuck = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if group in thread.name and frame is not None:
            calls = [f"{f.name}" for f in traceback.extract_stack(frame) if "retrytopics" in f.filename][-3:]
            stuck.append(f"{thread.name.rsplit('.', 1)[-1]} in {' > '.join(calls)}")
    return "; ".join(stuck) or "no consumer thread left"


def _await_assignment(app: RetryApp, kafka: Any, group: str, source: str, plan: DrillPlan) -> None:
    deadline = time.monotonic() + 60
    while not app.healthy or not _members(kafka, group):
        if app.error is not None:
            raise RuntimeError(f"the drill's app stopped: {app.error!r}") from app.error
        if time.monotonic() > deadline:
            raise RuntimeError("the drill's app did not join its group within 60 s")
        time.sleep(0.1)


def _describe(kafka: Any, group: str) -> Any:
    admin = make_admin(kafka)  # held until the answer is in: a collected client cancels its requests
    return admin.describe_consumer_groups([group], request_timeout=5)[group].result(timeout=10)


def _members(kafka: Any, group: str) -> bool:
    try:
        return bool(_describe(kafka, group).members)
    except Exception:  # noqa: BLE001 - the group does not exist yet
        return False


def _coordinator(kafka: Any, group: str) -> int | None:
    try:
        return int(_describe(kafka, group).coordinator.id)
    except Exception:  # noqa: BLE001 - informative only
        return None


def _killed_node(described: str) -> int | None:
    marker = "(node "
    return int(described.split(marker)[1].split(",")[0]) if marker in described else None


def _await_accounted(
    ledger: _Ledger,
    dead_letters: _DeadLetters,
    plan: DrillPlan,
    kafka: Any,
    group: str,
    source: str,
    topics: Any,
    app: _Operated,
) -> list[str]:
    """Wait until every id is handled or dead-lettered (starting the app again after a transaction of unknown
    outcome, as an operator does), then (20 s at most) until every running consumer committed to the end of
    its topic; returns the partitions still behind."""
    planned_dlq = {i for i in range(plan.records) if fate(i) in (NON_RETRYABLE, ALWAYS_FAIL)}
    planned_ok = set(range(plan.records)) - planned_dlq
    deadline = time.monotonic() + plan.timeout_s
    while not (planned_ok <= ledger.succeeded and planned_dlq <= set(dead_letters.copies)):
        if app.current.error is not None and not app.restart_if_outcome_unknown():
            return []  # the outcome names what is missing, and the app's error
        if time.monotonic() > deadline:
            return []
        time.sleep(0.2)
    # a duplicate still on its way would show up before every offset is committed
    return _await_committed(kafka, group, source, topics, plan, min(deadline, time.monotonic() + 20))


def _await_committed(kafka: Any, group: str, source: str, topics: Any, plan: DrillPlan, deadline: float) -> list[str]:
    groups = [(source, group), *[(t.topic, t.topic) for t in topics.tiers]]
    while True:
        try:
            behind = [where for t, g in groups for where in _not_committed_to_end(kafka, g, t, plan)]
        except KafkaClientError as exc:  # a node just restarted may not answer yet: ask again, within the deadline
            behind = [f"offsets not read: {exc}"]
        if not behind or time.monotonic() > deadline:
            return behind
        time.sleep(0.5)


def _not_committed_to_end(kafka: Any, group: str, topic: str, plan: DrillPlan) -> list[str]:
    consumer = make_consumer(kafka, group_id=None)
    try:
        ends = end_offsets(consumer, topic, plan.partitions)
    finally:
        consumer.close()
    committed = committed_offsets(kafka, group, topic, plan.partitions)
    # exactly-once, a partition ends with a transaction's commit marker, one offset past the last record
    marker = 1 if plan.exactly_once else 0
    return [
        f"{topic}[{p}] committed {committed[p]} of {ends[p]}"
        for p in ends
        if ends[p] > 0 and (committed[p] or 0) < ends[p] - marker
    ]


def _tier_copies(kafka: Any, tiers: list[str], partitions: int) -> dict[tuple[int, int], int]:
    copies: Counter[tuple[int, int]] = Counter()
    for topic in tiers:
        consumer = make_consumer(kafka, group_id=None)  # read_committed
        try:
            ends = end_offsets(consumer, topic, partitions)
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for message in consumer.consume(500, 0.2):
                    if message.error() is None:
                        try:
                            failures = decode(list(message.headers() or ())).reconsume_times
                        except HeaderDecodeError:
                            failures = -1
                        copies[(int(message.value() or b"-1"), failures)] += 1
                positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
                if all(tp.offset >= ends[tp.partition] for tp in positions):
                    break
        finally:
            consumer.close()
    return {key: n - 1 for key, n in copies.items() if n > 1}


def _outcome(
    fault: str,
    ledger: _Ledger,
    dead_letters: _DeadLetters,
    plan: DrillPlan,
    fault_at: float,
    tier_copies: dict[tuple[int, int], int],
    behind: tuple[list[str], list[str]],
    coordinator_killed: bool | None,
) -> Outcome:
    planned_dlq = {i for i in range(plan.records) if fate(i) in (NON_RETRYABLE, ALWAYS_FAIL)}
    accounted = ledger.succeeded | set(dead_letters.copies)
    early = [
        (i, topic, due - at)
        for i, calls in ledger.calls.items()
        for topic, _, at, due in calls
        if due is not None and at < due
    ]
    planned_calls = {SUCCEED: 1, FAIL_ONCE: 2, NON_RETRYABLE: 1, ALWAYS_FAIL: 1 + len(plan.delays)}
    extra = sum(len(ledger.calls.get(i, [])) for i in range(plan.records)) - sum(
        planned_calls[fate(i)] for i in range(plan.records)
    )
    first_call = {
        i: min(at for _, failures, at, _ in calls if failures == 0)
        for i, calls in ledger.calls.items()
        if any(f == 0 for _, f, _, _ in calls)
    }
    source_late = [at - ledger.produced_at[i] for i, at in first_call.items() if i in ledger.produced_at]
    source_wait = [at - ledger.acked_at[i] for i, at in first_call.items() if i in ledger.acked_at]
    produce_delay = [ledger.acked_at[i] - ledger.produced_at[i] for i in ledger.acked_at if i in ledger.produced_at]
    tier_late = [at - due for calls in ledger.calls.values() for _, _, at, due in calls if due is not None]
    return Outcome(
        fault=fault,
        lost=sorted(set(range(plan.records)) - accounted),
        early=early,
        duplicate_dead_letters={i: n - 1 for i, n in dead_letters.copies.items() if n > 1},
        unplanned_dead_letters=sorted(
            set(dead_letters.copies) - planned_dlq
            | {i for i, reason in dead_letters.reasons.items() if reason != _PLANNED_REASON.get(fate(i))}
        ),
        committed_tier_duplicates=tier_copies,
        uncommitted_while_running=behind[0],
        uncommitted=behind[1],
        extra_calls=extra,
        stall_s=_stall_s(sorted(ledger.source_handled), fault_at * 1000, max(ledger.produced_at.values(), default=0)),
        max_source_lateness_s=max(source_late, default=0) / 1000,
        max_source_wait_s=max(source_wait, default=0) / 1000,
        max_produce_delay_s=max(produce_delay, default=0) / 1000,
        max_tier_lateness_s=max(tier_late, default=0) / 1000,
        coordinator_killed=coordinator_killed,
    )


def _stall_s(handled_ms: list[int], fault_ms: float, last_produced_ms: int) -> float:
    """The longest time after the fault in which no source record was handled, among the gaps that began
    while records were still being produced (records produced at 200 a second waited through all of them)."""
    longest = 0.0
    previous = fault_ms
    for at in handled_ms:
        if at <= fault_ms:
            continue
        if previous <= last_produced_ms:
            longest = max(longest, at - previous)
        previous = at
    return longest / 1000
