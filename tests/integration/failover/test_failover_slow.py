"""Failover scenarios on the project's 3-node Apache Kafka cluster, in both delivery modes (marked `slow`: about
30 s each; `pytest -m slow tests/integration/failover` runs them).

Guarantee, for each fault (SIGKILL of a source partition's leader, SIGKILL of the active controller, a rolling
restart, a source partition's leader frozen by SIGSTOP for 20 s), while 2,400 records (6,000 for the rolling
restart and the freeze) flow at 200 a second through two tiers and the DLQ: every id is handled or
dead-lettered as planned (none lost), none is handled before its due time, none is dead-lettered twice, and
every consumer has committed to the end of its partitions once the app stopped. Exactly-once adds: no
(record, attempt) is written twice to a tier in the read_committed view. The stall (the longest time after
the fault in which no source record was handled) is printed with the rest of the ledger's figures.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from retrytopics.connectors.cluster import KafkaCluster

pytestmark = [pytest.mark.broker, pytest.mark.slow]

FAULTS = {
    "leader-kill": lambda drill: drill.kill_partition_leader(),
    "controller-kill": lambda drill: drill.kill_active_controller(),
    "rolling-restart": lambda drill: drill.rolling_restart(),
    "leader-frozen-20s": lambda drill: drill.freeze_partition_leader(20.0),
}


#: the leader kill at-least-once runs in every suite run (test_cluster.py)
CASES = [
    (fault, mode)
    for mode in ("at-least-once", "exactly-once")
    for fault in FAULTS
    if (fault, mode) != ("leader-kill", "at-least-once")
]


@pytest.mark.parametrize(("fault", "mode"), CASES)
def test_a_failover_loses_nothing_and_handles_nothing_early(
    cluster: KafkaCluster, drill: ModuleType, unique_name: Callable[[str], str], fault: str, mode: str
) -> None:
    # a rolling restart or a freeze lasts 20-30 s: production lasts as long, so that the whole fault meets a flow
    records = 2400 if fault.endswith("kill") else 6000
    plan = drill.DrillPlan(exactly_once=mode == "exactly-once", records=records)
    outcome = drill.run_drill(cluster, plan, FAULTS[fault](drill), name=unique_name)
    print(f"[{mode}] {outcome.summary()}")

    assert outcome.lost == [], "records neither handled nor dead-lettered"
    assert outcome.early == [], "handled before their due time"
    assert outcome.duplicate_dead_letters == {}, "dead-lettered more than once"
    assert outcome.unplanned_dead_letters == [], "dead-lettered although they were to succeed"
    assert outcome.uncommitted == [], "offsets left uncommitted after the app stopped"
    assert outcome.committed_tier_duplicates == {}, "a (record, attempt) committed twice to a tier"
