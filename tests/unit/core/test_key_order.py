"""Key-ordered retries, the pure core (retrytopics/core/key_order.py, docs/key-ordering.md).

The guarantee: for every key and source partition, no record is handled before every earlier record of its key
has reached a terminal state (handled successfully, or durably in the DLQ); records without a key are never held.
A simulation drives the real decision objects of a main consumer and two tier consumers over in-memory topics and
a key-state log, with every interleaving hypothesis finds of handler outcomes, tier choices, acknowledgements,
refused hops, late key-state reads and crashes, and checks the guarantee at every handler call.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrytopics.core.errors import ConfigError, HeaderDecodeError, KeyStateDecodeError
from retrytopics.core.headers import RECONSUME_TIMES
from retrytopics.core.keyorder.config import DeadHeadPolicy, KeyOrdering
from retrytopics.core.keyorder.follower import KEY_ORDER_AFTER, Follower, decode_follower, encode_follower
from retrytopics.core.keyorder.keys import ChainKey, key_id
from retrytopics.core.keyorder.source_chains import Admission, Admit, Release, SourceChains, batch_end
from retrytopics.core.keyorder.state_records import (
    Chain,
    Closed,
    Fate,
    KeyStateRecord,
    Passage,
    Waiting,
    decode_record,
    encode_record,
)
from retrytopics.core.keyorder.tier_passages import Step, TierDecision, TierPassages

SOURCE = "orders"
TIERS = 2
#: a record is dead-lettered as exhausted at its fourth failure
MAX_FAILURES = 3


# ------------------------------------------------------------------------------------------------------------
# The simulation


@dataclass(frozen=True)
class Hop:
    """A record in a tier or the DLQ: a retried record (`after` None) or a follower."""

    offset: int
    key: bytes
    after: int | None
    failures: int


@dataclass(frozen=True)
class Write:
    dest: str  # "tier", "dlq" or "state"
    payload: object
    origin: int | None  # index of the input record it belongs to (its commit waits for it)
    tier: int | None = None
    ack: tuple[object, ...] | None = None  # what the writer is told when it lands


@dataclass
class Node:
    """A consumer's position, commits and writes in flight (its decision object lives in `Sim`)."""

    pos: int = 0
    done: set[int] = field(default_factory=set)
    outstanding: dict[int, int] = field(default_factory=dict)
    inflight: deque[Write] = field(default_factory=deque)
    state_pos: int = 0

    def committed(self) -> int:
        position = 0
        while position in self.done and self.outstanding.get(position, 0) == 0:
            position += 1
        return position


class Sim:
    def __init__(
        self, keys: list[bytes], config: KeyOrdering, draw: st.DataObject | None, *, in_source: bool = False
    ) -> None:
        self.in_source = in_source
        self.follower_writes = 0  # followers written to a tier, copies included
        self.tier_writes = 0  # every record written to a tier
        self.source = list(enumerate(keys))
        self.config = config
        self.draw = draw
        self.tiers: list[list[Hop]] = [[] for _ in range(TIERS)]
        self.dlq: list[Hop] = []
        self.state: list[KeyStateRecord] = []
        self.main = SourceChains(config, source=SOURCE, partition=0, followers_in_source=in_source)
        self.passages = [TierPassages(config, tier=t) for t in range(TIERS)]
        self.nodes: dict[str, Node] = {"main": Node(), "t0": Node(), "t1": Node()}
        self.terminal: set[int] = set()
        self.calls: list[int] = []
        self.violations: list[str] = []
        self.unproven = 0
        self.now = 0
        self.refusals: dict[tuple[int, bool], bool] = {}

    # --- choices: hypothesis while exploring, the happy path while draining
    def choose(self, options: list[str]) -> str:
        return options[0] if self.draw is None else self.draw.draw(st.sampled_from(options))

    def choose_tier(self) -> int:
        return 0 if self.draw is None else self.draw.draw(st.integers(0, TIERS - 1))

    # --- the guarantee, checked at every handler call
    def waiting_for(self, key: bytes, offset: int) -> list[int]:
        """The earlier records of `key` that are not terminal yet."""
        return [o for o, k in self.source if k == key and o < offset and o not in self.terminal]

    def call(self, offset: int, key: bytes) -> str:
        earlier = self.waiting_for(key, offset)
        if earlier:
            self.violations.append(f"record {offset} of {key!r} handled before {earlier}")
        self.calls.append(offset)
        outcome = self.choose(["ok", "fail", "dead"])
        if outcome == "ok":
            self.terminal.add(offset)
        return outcome

    def chain(self, key: bytes) -> ChainKey:
        return ChainKey(SOURCE, 0, key_id(key))

    # --- writes
    def emit(self, node: Node, write: Write) -> None:
        if write.origin is not None:
            node.outstanding[write.origin] = node.outstanding.get(write.origin, 0) + 1
        node.inflight.append(write)

    def too_large(self, hop: Hop) -> bool:
        """Whether a tier refuses this hop as too large: a property of the record and the kind of hop (a retry
        carries exception headers, a follower does not), so every copy of one hop gets the same answer."""
        kind = (hop.offset, hop.after is None)
        if kind not in self.refusals:
            self.refusals[kind] = self.draw is not None and self.choose(["fits", "too_large"]) == "too_large"
        return self.refusals[kind]

    def land(self, write: Write) -> int | None:
        """Append `write` where it goes; returns the tier it landed in (None: the DLQ)."""
        if write.dest == "state":
            assert isinstance(write.payload, Chain | Passage | Waiting | Closed)
            self.state.append(write.payload)
            return None
        hop = write.payload
        assert isinstance(hop, Hop)
        if write.dest == "tier" and not self.too_large(hop):
            assert write.tier is not None
            self.tiers[write.tier].append(hop)
            self.tier_writes += 1
            self.follower_writes += hop.after is not None
            return write.tier
        self.dlq.append(hop)
        self.terminal.add(hop.offset)
        return None

    # --- the main consumer
    def main_next(self) -> Admission | None:
        node = self.nodes["main"]
        if node.pos >= len(self.source):
            return None
        admission = self.main.admit(key_id(self.source[node.pos][1]))
        return None if admission.action in (Admit.WAIT, Admit.PAUSE) else admission

    def release_step(self) -> None:
        """The main consumer reads a follower kept in the source again and handles it (or dead-letters it
        unhandled, under `dead_letter` behind a dead-lettered record): it is not one of its node's positions,
        its offset was committed when it was kept."""
        release = self.main.releases()[0]
        self.main.released(release.key, release.offset)
        offset, key = self.source[release.offset]
        node = self.nodes["main"]
        if release.dead_letter:
            self.hand_off(node, Hop(offset, key, None, 0), None, tier=None)
            return
        outcome = self.call(offset, key)
        if outcome == "ok":
            for record in self.main.succeeded(release.key, offset):
                self.emit(node, Write("state", record, None))
        else:
            self.hand_off(node, Hop(offset, key, None, 1), None, tier=self.choose_tier() if outcome == "fail" else None)

    def main_step(self) -> None:
        node, admission = self.nodes["main"], self.main_next()
        assert admission is not None
        index = node.pos
        offset, key = self.source[index]
        if admission.action is Admit.FOLLOW:
            assert admission.tier is not None
            self.hand_off(node, Hop(offset, key, admission.after, 0), index, tier=admission.tier)
        elif admission.action is Admit.KEEP:
            for record in self.main.kept(key_id(key), offset, now_ms=self.now):
                self.emit(node, Write("state", record, index))
        else:
            outcome = self.call(offset, key)
            if outcome == "fail":
                self.hand_off(node, Hop(offset, key, None, 1), index, tier=self.choose_tier())
            elif outcome == "dead":
                self.hand_off(node, Hop(offset, key, None, 1), index, tier=None)
        node.done.add(index)
        node.pos += 1

    def hand_off(self, node: Node, hop: Hop, index: int | None, *, tier: int | None) -> None:
        self.main.handed_off(key_id(hop.key), hop.offset, now_ms=self.now)
        dest = "dlq" if tier is None else "tier"
        self.emit(node, Write(dest, hop, index, tier, ack=("main", hop.key, hop.offset)))

    # --- a tier consumer
    def tier_decision(self, tier: int) -> TierDecision | None:
        node = self.nodes[f"t{tier}"]
        if node.pos >= len(self.tiers[tier]):
            return None
        hop, passages = self.tiers[tier][node.pos], self.passages[tier]
        chain = self.chain(hop.key)
        decision = passages.on_retry(chain) if hop.after is None else passages.on_follower(chain, hop.offset, hop.after)
        return None if decision.step is Step.WAIT else decision

    def tier_step(self, tier: int) -> None:
        node, decision = self.nodes[f"t{tier}"], self.tier_decision(tier)
        assert decision is not None
        index, passages = node.pos, self.passages[tier]
        hop = self.tiers[tier][index]
        chain = self.chain(hop.key)
        ack = ("tier", tier, chain, hop.offset)
        if decision.step is Step.HANDLE:
            outcome = self.call(hop.offset, hop.key)
            failures = (0 if hop.after is not None else hop.failures) + 1
            records: list[KeyStateRecord] = []
            if outcome == "ok":
                records = passages.handled(chain, hop.offset, to_tier=None)
            elif outcome == "fail" and failures <= MAX_FAILURES:
                to = self.choose_tier()
                records = passages.handled(chain, hop.offset, to_tier=to)
                self.emit(node, Write("tier", Hop(hop.offset, hop.key, None, failures), index, to, ack))
            else:
                records = passages.handled(chain, hop.offset, to_tier=None, dead_lettered=True)
                self.emit(node, Write("dlq", Hop(hop.offset, hop.key, None, failures), index, None, ack))
            for record in records:
                self.emit(node, Write("state", record, index))
        elif decision.step is Step.FORWARD:
            assert decision.tier is not None and hop.after is not None
            for record in passages.forwarded(chain, hop.offset, after=hop.after, to_tier=decision.tier):
                self.emit(node, Write("state", record, index))
            self.emit(node, Write("tier", Hop(hop.offset, hop.key, decision.after, 0), index, decision.tier, ack))
        elif decision.step in (Step.DEAD_LETTER, Step.UNPROVEN):
            self.unproven += decision.step is Step.UNPROVEN
            for record in passages.dead_lettered(chain, hop.offset):
                self.emit(node, Write("state", record, index))
            self.emit(node, Write("dlq", hop, index, None, ack))
        node.done.add(index)
        node.pos += 1

    # --- acknowledgements, live key-state reads, crashes
    def node_name(self, ack: tuple[object, ...]) -> str:
        return "main" if ack[0] == "main" else f"t{ack[1]}"

    def ack_step(self, name: str) -> None:
        node = self.nodes[name]
        write = node.inflight.popleft()
        landed = self.land(write)
        if write.origin is not None:
            node.outstanding[write.origin] -= 1
        records: list[KeyStateRecord] = []
        if write.ack is not None and write.ack[0] == "main":
            _, key, offset = write.ack
            assert isinstance(key, bytes) and isinstance(offset, int)
            records = self.main.acked(key_id(key), offset, landed=landed)
        elif write.ack is not None:
            _, tier, chain, offset = write.ack
            assert isinstance(tier, int) and isinstance(chain, ChainKey) and isinstance(offset, int)
            records = self.passages[tier].acked(chain, offset, landed=landed)
        for record in records:
            self.emit(node, Write("state", record, write.origin))

    def learn_step(self, name: str) -> None:
        node = self.nodes[name]
        record = self.state[node.state_pos]
        node.state_pos += 1
        tombstone = self.main.learn(record)
        if tombstone is not None:
            self.emit(node, Write("state", tombstone, None))

    def crash(self, name: str, survivors: int) -> None:
        """The consumer dies: the first `survivors` of its writes in flight reached the log (it never heard),
        the rest are lost; it restarts from its committed position and the key-state topic."""
        node = self.nodes[name]
        for write in list(node.inflight)[:survivors]:
            self.land(write)
        start = node.committed()
        self.nodes[name] = Node(pos=start, done={i for i in node.done if i < start}, state_pos=len(self.state))
        if name == "main":
            self.main, tombstones = SourceChains.rebuild(
                self.config, self.state, source=SOURCE, partition=0, followers_in_source=self.in_source
            )
            for tombstone in tombstones:
                self.emit(self.nodes[name], Write("state", tombstone, None))
        else:
            tier = int(name[1])
            self.passages[tier], tombstones = TierPassages.rebuild(self.config, self.state, tier=tier)
            for tombstone in tombstones:
                self.emit(self.nodes[name], Write("state", tombstone, None))

    # --- driving
    def actions(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for name, node in self.nodes.items():
            if node.inflight:
                found.append(("ack", name))
            if name == "main" and node.state_pos < len(self.state):
                found.append(("learn", name))
        if self.main_next() is not None:
            found.append(("step", "main"))
        if self.main.releases():
            found.append(("release", "main"))
        found += [("step", f"t{t}") for t in range(TIERS) if self.tier_decision(t) is not None]
        return found

    def act(self, kind: str, name: str) -> None:
        self.now += 1
        if kind == "ack":
            self.ack_step(name)
        elif kind == "learn":
            self.learn_step(name)
        elif kind == "release":
            self.release_step()
        elif name == "main":
            self.main_step()
        else:
            self.tier_step(int(name[1]))
        assert self.main.blocked() <= self.config.max_blocked_keys

    def drain(self, steps: int = 10_000) -> None:
        self.draw = None
        for _ in range(steps):
            found = self.actions()
            if not found:
                return
            self.act(*found[0])
        raise AssertionError("the simulation did not settle")


def explore(
    data: st.DataObject,
    keys: list[bytes],
    config: KeyOrdering,
    *,
    crashes: bool,
    in_source: bool = False,
    upgrade: bool = False,
) -> Sim:
    """Random steps (and crashes), then drained; `upgrade`: the main consumer restarts keeping followers in
    the source at its first crash, with the chains and followers the other way in the topics."""
    sim = Sim(keys, config, data, in_source=in_source)
    for _ in range(data.draw(st.integers(0, 120))):
        found = sim.actions()
        if crashes and data.draw(st.integers(0, 19)) == 0:
            name = data.draw(st.sampled_from(sorted(sim.nodes)))
            sim.in_source = sim.in_source or (upgrade and name == "main")
            sim.crash(name, data.draw(st.integers(0, len(sim.nodes[name].inflight))))
            continue
        if not found:
            break
        sim.act(*data.draw(st.sampled_from(found)))
    sim.drain()
    return sim


KEYS = st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=10)
POLICIES = st.sampled_from(list(DeadHeadPolicy))


@settings(max_examples=400, deadline=None)
@given(data=st.data(), keys=KEYS, policy=POLICIES, bound=st.integers(1, 3), in_source=st.booleans())
def test_any_interleaving_handles_each_key_in_source_order(
    data: st.DataObject, keys: list[bytes], policy: DeadHeadPolicy, bound: int, in_source: bool
) -> None:
    """Whatever the handler outcomes (success, retryable failure to any tier, dead letter), hops refused as too
    large, late acknowledgements and late key-state reads, under both dead-letter policies and any bound on
    blocked keys, with followers riding the tiers or kept in the source: no record is handled before every
    earlier record of its key is terminal, every record ends terminal (nothing lost, no key stuck), and no
    follower is ever left unaccounted for (`UNPROVEN`). Kept in the source, no follower is ever written to a
    tier: the tiers hold the failures' hops only, as without ordering."""
    config = KeyOrdering(dead_head=policy, max_blocked_keys=bound)
    sim = explore(data, keys, config, crashes=False, in_source=in_source)
    assert sim.violations == []
    assert sim.terminal == set(range(len(keys)))
    assert sim.unproven == 0
    assert sim.main.blocked() == 0
    if in_source:
        assert sim.follower_writes == 0


@settings(max_examples=400, deadline=None)
@given(data=st.data(), keys=KEYS, policy=POLICIES, in_source=st.booleans())
def test_crashes_at_any_point_keep_the_order(
    data: st.DataObject, keys: list[bytes], policy: DeadHeadPolicy, in_source: bool
) -> None:
    """A consumer (main or tier) killed at any point, with any prefix of its writes in flight reaching the log,
    restarts from its committed position and the key-state topic: handler calls may repeat (at-least-once),
    but none runs before every earlier record of its key is terminal, every record ends terminal, and no key
    stays blocked; kept in the source, no follower is lost (its offset was committed before it ran)."""
    config = KeyOrdering(dead_head=policy, max_blocked_keys=2)
    sim = explore(data, keys, config, crashes=True, in_source=in_source)
    assert sim.violations == []
    assert sim.terminal == set(range(len(keys)))
    assert sim.unproven == 0
    assert sim.main.blocked() == 0
    if in_source:
        assert sim.follower_writes == 0


@settings(max_examples=150, deadline=None)
@given(data=st.data(), keys=KEYS, policy=POLICIES)
def test_a_main_consumer_restarted_to_keep_followers_in_the_source_honours_the_chains_written_before(
    data: st.DataObject, keys: list[bytes], policy: DeadHeadPolicy
) -> None:
    """Chains written riding the tiers (version 1 chain records, followers in tiers) are read by a main
    consumer restarted to keep followers in the source: the tiers settle the followers they hold as before,
    the new ones wait in the source behind them; order kept, nothing lost or stuck."""
    sim = explore(data, keys, KeyOrdering(dead_head=policy, max_blocked_keys=2), crashes=True, upgrade=True)
    assert sim.violations == []
    assert sim.terminal == set(range(len(keys)))
    assert sim.unproven == 0
    assert sim.main.blocked() == 0


@settings(max_examples=300, deadline=None)
@given(data=st.data(), keys=KEYS, policy=POLICIES, in_source=st.booleans())
def test_a_rebuilt_state_decides_as_the_live_one(
    data: st.DataObject, keys: list[bytes], policy: DeadHeadPolicy, in_source: bool
) -> None:
    """At any point where a consumer has no write in flight and has read the whole key-state topic, the state
    a new owner rebuilds from that topic takes the same decision as the live one for every record it would
    read next (and, for the main consumer, for every key)."""
    config = KeyOrdering(dead_head=policy, max_blocked_keys=2)
    sim = Sim(keys, config, data, in_source=in_source)
    for _ in range(data.draw(st.integers(0, 120))):
        found = sim.actions()
        if not found:
            break
        sim.act(*data.draw(st.sampled_from(found)))
        for name, node in sim.nodes.items():
            if node.inflight or (name == "main" and node.state_pos < len(sim.state)):
                continue
            if name == "main":
                rebuilt, tombstones = SourceChains.rebuild(
                    config, sim.state, source=SOURCE, partition=0, followers_in_source=in_source
                )
                assert tombstones == []
                for key in (b"a", b"b", b"c"):
                    assert rebuilt.admit(key_id(key)) == sim.main.admit(key_id(key))
                    assert rebuilt.chain(key_id(key)) == sim.main.chain(key_id(key))
                assert sorted(rebuilt.releases(), key=repr) == sorted(sim.main.releases(), key=repr)
            else:
                tier = int(name[1])
                again, _ = TierPassages.rebuild(config, sim.state, tier=tier)
                for hop in sim.tiers[tier][node.pos :]:
                    chain = sim.chain(hop.key)
                    if hop.after is None:
                        assert again.on_retry(chain) == sim.passages[tier].on_retry(chain)
                    else:
                        live = sim.passages[tier].on_follower(chain, hop.offset, hop.after)
                        assert again.on_follower(chain, hop.offset, hop.after) == live


def test_the_simulation_catches_a_follower_released_early() -> None:
    """The checks can fail: a tier that handles every follower at once (no ordering) is caught."""

    class Unordered(TierPassages):
        def on_follower(self, chain: ChainKey, offset: int, after: int) -> TierDecision:
            return TierDecision(Step.HANDLE)

    sim = Sim([b"a", b"a"], KeyOrdering(), None)
    sim.passages = [Unordered(sim.config, tier=t) for t in range(TIERS)]
    outcomes = iter(["fail", "ok", "ok"])
    sim.choose = lambda options: next(outcomes) if options == ["ok", "fail", "dead"] else options[0]  # type: ignore[method-assign]
    sim.main_step()  # a@0 fails: to tier 0, a chain opens once acknowledged
    sim.ack_step("main")
    sim.main_step()  # a@1 follows it into tier 0
    sim.ack_step("main")
    sim.tier_step(0)  # tier 0 reads a@0 (the retry)... its handler succeeds
    sim.violations.clear()
    sim.tiers[0].insert(0, Hop(1, b"a", 0, 0))  # ...but put the follower first, as an unordered tier would meet it
    sim.nodes["t0"].pos = 0
    sim.terminal.discard(0)
    sim.tier_step(0)
    assert sim.violations == ["record 1 of b'a' handled before [0]"]


@pytest.mark.parametrize(("in_source", "tier_writes"), [(False, 630), (True, 60)])
def test_a_key_that_always_fails_costs_tier_writes_linear_in_its_records(in_source: bool, tier_writes: int) -> None:
    """One key, 20 records, every handler call failing until the record is exhausted (3 retries, then the
    DLQ): kept in the source, the tiers receive each record's own 3 retries and nothing else (60, what they
    receive without ordering); riding the tiers, every follower trails every front record through every tier
    it visits (630: 60 plus 3 × (19 + 18 + ... + 1), about n² × retries / 2)."""
    sim = Sim([b"a"] * 20, KeyOrdering(), None, in_source=in_source)
    sim.choose = lambda options: "fail" if options == ["ok", "fail", "dead"] else options[0]  # type: ignore[method-assign]
    sim.drain()
    assert sim.violations == []
    assert sim.terminal == set(range(20))
    assert len(sim.dlq) == 20
    assert sim.tier_writes == tier_writes
    assert sim.follower_writes == (0 if in_source else tier_writes - 60)


def issue_workload(records: int, keys: int, *, in_source: bool, seed: int = 36) -> Sim:
    """Issue 36's workload in the simulation: `records` over `keys` keys, 10 % failing once, 1 % always
    failing (exhausted after `MAX_FAILURES` retries), everything else succeeding; drained in one interleaving."""
    rng = random.Random(seed)
    source = [f"k{rng.randrange(keys)}".encode() for _ in range(records)]
    kind = {
        o: ("always" if r < 0.01 else "once" if r < 0.11 else "ok") for o, r in enumerate(rng.random() for _ in source)
    }
    sim = Sim(source, KeyOrdering(max_blocked_keys=keys), None, in_source=in_source)
    calls: dict[int, int] = {}

    def call(offset: int, key: bytes) -> str:
        earlier = sim.waiting_for(key, offset)
        if earlier:
            sim.violations.append(f"record {offset} of {key!r} handled before {earlier}")
        sim.calls.append(offset)
        calls[offset] = calls.get(offset, 0) + 1
        fails = kind[offset] == "always" or (kind[offset] == "once" and calls[offset] == 1)
        if not fails:
            sim.terminal.add(offset)
        return "fail" if fails else "ok"

    sim.call = call  # type: ignore[method-assign]
    sim.drain(steps=10_000_000)
    return sim


@pytest.mark.parametrize("in_source", [False, True])
def test_on_the_issues_workload_the_tiers_hold_at_most_twice_what_they_hold_without_ordering(in_source: bool) -> None:
    """600 records over 10 keys, 10 % failing once, 1 % always: without ordering the tiers receive one hop per
    failure (a record failing once: 1; always: `MAX_FAILURES`). Kept in the source, with ordering they receive
    exactly that (no follower is a tier record); riding the tiers, many times more. Key order's records on
    the key-state topic stay bounded per failure and per follower."""
    sim = issue_workload(600, 10, in_source=in_source)
    assert sim.violations == []
    assert sim.terminal == set(range(600))
    calls = Counter(sim.calls)
    unordered = sum(n - 1 for n in calls.values()) + len(sim.dlq)  # each failed call's hop (the last to the DLQ)
    unordered_tiers = unordered - len(sim.dlq)
    if in_source:
        assert sim.tier_writes == unordered_tiers
        followers = sum(isinstance(r, Waiting) for r in sim.state)
        failures = unordered
        # per follower: its Waiting record, that record's tombstone and one chain record (or the closing tombstone);
        # per failure: one passage per tier visited (and its tombstone) and the chain record of a new front
        assert len(sim.state) <= 3 * followers + 4 * failures + 2 * len({sim.source[o][1] for o in calls})
    else:
        assert sim.tier_writes > 2 * unordered_tiers


# ------------------------------------------------------------------------------------------------------------
# Decisions, one by one


def chains(**config: object) -> SourceChains:
    return SourceChains(KeyOrdering(**config), source=SOURCE, partition=3)  # type: ignore[arg-type]


def test_records_without_a_key_are_never_held() -> None:
    """A null key is not ordered: handled even with every slot for blocked keys taken."""
    main = chains(max_blocked_keys=1)
    main.handed_off(key_id(b"k"), 5, now_ms=1)
    main.acked(key_id(b"k"), 5, landed=0)
    assert main.admit(None) == Admission(Admit.HANDLE)
    assert main.admit(key_id(b"other")) == Admission(Admit.PAUSE)


def test_a_blocked_key_follows_its_last_record_and_waits_for_its_acknowledgement() -> None:
    """A key's next record waits while its last hand-off is unacknowledged, then follows it into its tier;
    each acknowledged hop returns the chain record to write, a head dead-lettered at once opens no chain."""
    main = chains()
    k = key_id(b"acct-7")
    assert main.admit(k) == Admission(Admit.HANDLE)
    main.handed_off(k, 41, now_ms=1000)
    assert main.admit(k) == Admission(Admit.WAIT)
    opened = main.acked(k, 41, landed=1)
    assert opened == [Chain(chain=ChainKey(SOURCE, 3, k), head=41, frontier=41, at_tier=1, followers=0, since_ms=1000)]
    assert main.admit(k) == Admission(Admit.FOLLOW, 1, 41)
    main.handed_off(k, 57, now_ms=2000)
    assert main.acked(k, 57, landed=None) == []  # the follower was refused as too large: dead-lettered
    assert main.admit(k) == Admission(Admit.FOLLOW, 1, 41)
    other = key_id(b"acct-8")
    main.handed_off(other, 60, now_ms=3000)
    assert main.acked(other, 60, landed=None) == []
    assert main.admit(other) == Admission(Admit.HANDLE)


def test_the_main_consumer_follows_passages_and_closes_a_chain_on_its_frontiers_fate() -> None:
    """A passage saying the frontier went on to another tier moves where followers go; one saying it is
    terminal closes the chain (a tombstone to write); passages about older records change nothing."""
    main = chains()
    k = key_id(b"k")
    chain = ChainKey(SOURCE, 3, k)
    main.handed_off(k, 10, now_ms=0)
    main.acked(k, 10, landed=0)
    assert main.learn(Passage(tier=0, chain=chain, seen=9, fate=Fate.SUCCEEDED)) is None
    assert main.learn(Passage(tier=0, chain=chain, seen=10, fate=Fate.SENT, to_tier=1, after=10)) is None
    assert main.admit(k) == Admission(Admit.FOLLOW, 1, 10)
    assert main.learn(Passage(tier=1, chain=chain, seen=10, fate=Fate.DEAD_LETTERED)) == Closed(chain=chain)
    assert main.admit(k) == Admission(Admit.HANDLE)
    assert main.blocked() == 0


def test_followers_kept_in_the_source_are_released_one_at_a_time_once_the_front_is_terminal() -> None:
    """Kept in the source, a blocked key's records are written down (`Waiting`), never handed off; once a
    passage shows the front terminal the first of them is released, and the next only once that one is
    terminal: settled here (a version 2 chain record), or, failed, the chain's front in a tier; the chain
    closes when none waits and its front is terminal."""
    main = SourceChains(KeyOrdering(), source=SOURCE, partition=3, followers_in_source=True)
    k = key_id(b"k")
    chain = ChainKey(SOURCE, 3, k)
    main.handed_off(k, 10, now_ms=0)
    assert main.admit(k) == Admission(Admit.WAIT)  # the head's hop is not acknowledged yet
    main.acked(k, 10, landed=0)
    assert [main.admit(k), main.admit(k)] == [Admission(Admit.KEEP)] * 2
    assert main.kept(k, 11, now_ms=5) == [Waiting(chain=chain, offset=11, since_ms=5)]
    assert main.kept(k, 12, now_ms=6) == [Waiting(chain=chain, offset=12, since_ms=6)]
    assert main.kept(k, 11, now_ms=7) == []  # read again after a restart: waiting already
    assert main.releases() == []  # the head is in tier 0
    assert main.learn(Passage(tier=0, chain=chain, seen=10, fate=Fate.SUCCEEDED)) is None  # not closed: 2 wait
    assert main.releases() == [Release(k, 11, dead_letter=False)]
    main.released(k, 11)
    assert main.releases() == []
    assert main.succeeded(k, 11) == [
        Chain(chain=chain, head=10, frontier=11, at_tier=0, followers=1, since_ms=0, settled=Fate.SUCCEEDED),
        Closed(chain=chain, waiting=11),
    ]
    assert main.releases() == [Release(k, 12, dead_letter=False)]
    main.released(k, 12)
    main.handed_off(k, 12, now_ms=8)  # its handler failed: routed to tier 1 as a first failure
    assert main.acked(k, 12, landed=1) == [
        Chain(chain=chain, head=10, frontier=12, at_tier=1, followers=2, since_ms=0),
        Closed(chain=chain, waiting=12),
    ]
    assert main.kept(k, 13, now_ms=9) == [Waiting(chain=chain, offset=13, since_ms=9)]
    assert main.learn(Passage(tier=1, chain=chain, seen=12, fate=Fate.DEAD_LETTERED)) is None
    assert main.releases() == [Release(k, 13, dead_letter=False)]  # `release`: the DLQ holds the gap
    main.released(k, 13)
    assert main.succeeded(k, 13) == [Closed(chain=chain, waiting=13), Closed(chain=chain)]
    assert main.blocked() == 0
    assert main.admit(k) == Admission(Admit.HANDLE)


def test_kept_in_the_source_behind_a_dead_lettered_record_followers_are_dead_lettered_under_dead_letter() -> None:
    """Under `dead_letter`, a follower released behind a dead-lettered record is dead-lettered unhandled, and
    so is the next one behind it; a rebuilt state, from a version 1 chain record and the `Waiting` records,
    releases the same."""
    config = KeyOrdering(dead_head=DeadHeadPolicy.DEAD_LETTER)
    main = SourceChains(config, source=SOURCE, partition=3, followers_in_source=True)
    k = key_id(b"k")
    chain = ChainKey(SOURCE, 3, k)
    main.handed_off(k, 10, now_ms=0)
    written: list[KeyStateRecord] = main.acked(k, 10, landed=0)
    written += main.kept(k, 11, now_ms=1) + main.kept(k, 12, now_ms=2)
    dead = Passage(tier=0, chain=chain, seen=10, fate=Fate.DEAD_LETTERED)
    main.learn(dead)
    assert main.releases() == [Release(k, 11, dead_letter=True)]
    rebuilt, tombstones = SourceChains.rebuild(
        config, [*written, dead], source=SOURCE, partition=3, followers_in_source=True
    )
    assert tombstones == [] and rebuilt.releases() == main.releases()
    main.released(k, 11)
    main.handed_off(k, 11, now_ms=3)
    main.acked(k, 11, landed=None)  # in the DLQ as blocked_by_key
    assert main.releases() == [Release(k, 12, dead_letter=True)]


def test_a_follower_under_a_dead_lettered_head_is_released_or_dead_lettered_by_policy() -> None:
    """`release` runs the follower of a dead-lettered record; `dead_letter` dead-letters it, and the one
    behind it too; a follower of a handled record runs under both. Nothing is decided while the DLQ write
    is unacknowledged."""
    chain = ChainKey(SOURCE, 0, key_id(b"k"))
    for policy, step in ((DeadHeadPolicy.RELEASE, Step.HANDLE), (DeadHeadPolicy.DEAD_LETTER, Step.DEAD_LETTER)):
        tier = TierPassages(KeyOrdering(dead_head=policy), tier=1)
        assert tier.handled(chain, 10, to_tier=None, dead_lettered=True) == []
        assert tier.on_follower(chain, 12, 10) == TierDecision(Step.WAIT)
        dead = Passage(tier=1, chain=chain, seen=10, fate=Fate.DEAD_LETTERED)
        assert tier.acked(chain, 10, landed=None) == [dead]
        assert tier.on_follower(chain, 12, 10) == TierDecision(step)
        if step is Step.DEAD_LETTER:
            tier.dead_lettered(chain, 12)
            tier.acked(chain, 12, landed=None)
            assert tier.on_follower(chain, 15, 12) == TierDecision(Step.DEAD_LETTER)
        settled = tier.handled(chain, 20, to_tier=None)
        assert settled[0] == Passage(tier=1, chain=chain, seen=20, fate=Fate.SUCCEEDED)
        assert all(isinstance(r, Closed) and r.seen is not None and r.seen < 20 for r in settled[1:])
        assert tier.on_follower(chain, 21, 20) == TierDecision(Step.HANDLE)


def test_a_tier_forwards_a_follower_behind_its_predecessor_and_recognises_copies() -> None:
    """A follower of a record sent on is forwarded there; a dropped forward keeps the next follower waiting
    behind the same record; an unknown predecessor is unproven, never handled; a copy at or below a record
    settled here is a duplicate."""
    chain = ChainKey(SOURCE, 0, key_id(b"k"))
    tier = TierPassages(KeyOrdering(), tier=0)
    assert tier.on_follower(chain, 12, 10) == TierDecision(Step.UNPROVEN)
    assert tier.on_retry(chain) == TierDecision(Step.HANDLE)
    tier.handled(chain, 10, to_tier=1)
    assert tier.on_retry(chain) == TierDecision(Step.WAIT)
    sent = Passage(tier=0, chain=chain, seen=10, fate=Fate.SENT, to_tier=1, after=10)
    assert tier.acked(chain, 10, landed=1) == [sent]
    assert tier.on_follower(chain, 12, 10) == TierDecision(Step.FORWARD, 1, 10)
    tier.forwarded(chain, 12, after=10, to_tier=1)
    dropped = tier.acked(chain, 12, landed=None)
    assert dropped == [Passage(tier=0, chain=chain, seen=12, fate=Fate.SENT, to_tier=1, after=10)]
    assert tier.on_follower(chain, 15, 12) == TierDecision(Step.FORWARD, 1, 10)
    assert tier.on_follower(chain, 30, 20) == TierDecision(Step.UNPROVEN)
    tier.handled(chain, 15, to_tier=None)  # 15 succeeds here: everything up to it is terminal
    assert tier.on_follower(chain, 12, 11) == TierDecision(Step.DUPLICATE)


def test_a_record_passing_a_tier_twice_keeps_each_follower_behind_its_own_predecessor() -> None:
    """A record that fails in a tier and is sent back to that same tier, with followers on both sides of its
    second visit: each follower is forwarded or released by its own predecessor's fate, not by the key's
    last record read there."""
    chain = ChainKey(SOURCE, 0, key_id(b"k"))
    tier = TierPassages(KeyOrdering(), tier=1)
    tier.handled(chain, 2, to_tier=1)  # 2 failed here and comes back here
    tier.acked(chain, 2, landed=1)
    assert tier.on_follower(chain, 4, 2) == TierDecision(Step.FORWARD, 1, 2)
    tier.forwarded(chain, 4, after=2, to_tier=1)
    tier.acked(chain, 4, landed=1)
    tier.handled(chain, 2, to_tier=None)  # 2's second visit: it succeeds
    assert tier.on_follower(chain, 5, 4) == TierDecision(Step.FORWARD, 1, 4)  # 5 came before 4's second visit
    assert tier.on_follower(chain, 4, 2) == TierDecision(Step.HANDLE)


def test_a_rebuilt_tier_starts_from_its_own_passages() -> None:
    """A new owner of a tier partition knows what the previous owner did with each record it wrote a passage
    for, ignores other tiers' passages, and drops what a tombstone removed."""
    chain = ChainKey(SOURCE, 0, key_id(b"k"))
    log: list[KeyStateRecord] = [
        Passage(tier=0, chain=chain, seen=3, fate=Fate.SENT, to_tier=1, after=3),
        Passage(tier=1, chain=chain, seen=3, fate=Fate.SUCCEEDED),
        Passage(tier=0, chain=chain, seen=5, fate=Fate.SENT, to_tier=1, after=5),
        Closed(chain=chain, tier=0, seen=5),
    ]
    tier, tombstones = TierPassages.rebuild(KeyOrdering(), log, tier=0)
    assert tombstones == []
    assert tier.on_follower(chain, 5, 3) == TierDecision(Step.FORWARD, 1, 3)
    assert tier.on_follower(chain, 7, 5) == TierDecision(Step.UNPROVEN)


def test_the_bounds_hold() -> None:
    """At `max_blocked_keys` open chains the main consumer pauses before a record of another key; a tier
    remembers at most `max_tracked_records` records, forgetting the least recently used idle chain and
    tombstoning its passages."""
    main = chains(max_blocked_keys=2, max_tracked_records=2)
    for offset, name in enumerate([b"a", b"b"]):
        main.handed_off(key_id(name), offset, now_ms=0)
        main.acked(key_id(name), offset, landed=0)
    assert main.admit(key_id(b"c")) == Admission(Admit.PAUSE)
    assert main.admit(key_id(b"a")).action is Admit.FOLLOW
    tier = TierPassages(KeyOrdering(max_blocked_keys=2, max_tracked_records=2), tier=0)
    first, second, third = (ChainKey(SOURCE, 0, key_id(k)) for k in (b"a", b"b", b"c"))
    tier.handled(first, 1, to_tier=None)
    tier.handled(second, 2, to_tier=None)
    assert tier.handled(third, 3, to_tier=None)[1:] == [Closed(chain=first, tier=0, seen=1)]
    assert tier.tracked() == 2
    assert tier.on_follower(first, 4, 1) == TierDecision(Step.UNPROVEN)


@given(st.lists(st.sampled_from([b"a", b"b", b"c", None]), max_size=12))
def test_a_batch_call_never_holds_two_records_of_one_key(keys: list[bytes | None]) -> None:
    """Cut at `batch_end` again and again, a run becomes calls in which no key appears twice, in order, none
    empty, every record in exactly one; records without a key never cut a call."""
    calls, rest = [], keys
    while rest:
        end = batch_end(rest)
        assert end > 0
        calls.append(rest[:end])
        rest = rest[end:]
    assert [k for call in calls for k in call] == keys
    for call in calls:
        keyed = [k for k in call if k is not None]
        assert len(keyed) == len(set(keyed))
    assert batch_end([None, None]) == 2


def test_configuration_errors_name_the_field() -> None:
    """Bad settings fail at start-up with the field named."""
    with pytest.raises(ConfigError, match="max_blocked_keys"):
        KeyOrdering(max_blocked_keys=0)
    with pytest.raises(ConfigError, match="dead_head"):
        KeyOrdering(dead_head="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_tracked_records"):
        KeyOrdering(max_blocked_keys=10, max_tracked_records=5)
    assert KeyOrdering(dead_head="dead_letter").dead_head is DeadHeadPolicy.DEAD_LETTER  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------------
# Wire forms


@given(st.binary(max_size=200))
def test_key_ids_are_bounded_and_tell_keys_apart(key: bytes) -> None:
    """A key id is at most 33 bytes; a short key is kept as it is, a long one digested; two ids are equal
    only for equal keys (up to a 128-bit digest)."""
    kid = key_id(key)
    assert len(kid) <= 33
    assert kid == (b"\x00" + key if len(key) <= 32 else kid)
    assert key_id(key + b"x") != kid


CHAINS = st.builds(
    ChainKey, st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True), st.integers(0, 2**31 - 1), st.binary().map(key_id)
)
OFFSETS = st.integers(0, 2**63 - 1)
RECORDS = st.one_of(
    st.builds(Closed, chain=CHAINS),
    st.builds(Closed, chain=CHAINS, tier=st.integers(0, 99), seen=OFFSETS),
    st.builds(
        Chain,
        chain=CHAINS,
        head=st.just(5),
        frontier=st.integers(5, 2**63 - 1),
        at_tier=st.integers(0, 99),
        followers=OFFSETS,
        since_ms=st.integers(-1, 2**63 - 1),
        settled=st.sampled_from([None, Fate.SUCCEEDED, Fate.DEAD_LETTERED]),
    ),
    st.builds(Waiting, chain=CHAINS, offset=OFFSETS, since_ms=st.integers(-1, 2**63 - 1)),
    st.builds(Closed, chain=CHAINS, waiting=OFFSETS),
    st.builds(
        Passage,
        tier=st.integers(0, 99),
        chain=CHAINS,
        seen=OFFSETS,
        fate=st.sampled_from([Fate.SUCCEEDED, Fate.DEAD_LETTERED]),
    ),
    st.builds(
        lambda t, c, s, to: Passage(tier=t, chain=c, seen=s, fate=Fate.SENT, to_tier=to, after=s // 2),
        st.integers(0, 99),
        CHAINS,
        OFFSETS,
        st.integers(0, 99),
    ),
)


@given(RECORDS)
def test_key_state_records_round_trip_in_the_partition_of_their_source(record: KeyStateRecord) -> None:
    """Every record reads back as written, at most 512 bytes of key and of value, in the partition of its
    source partition (everything about one chain is in one partition, in write order)."""
    key, value, partition = encode_record(record)
    assert decode_record(key, value) == record
    assert partition == record.chain.source_partition
    assert len(key) <= 512 and (value is None or len(value) <= 512)


@given(st.binary(max_size=600) | st.none(), st.binary(max_size=600) | st.none())
def test_malformed_key_state_raises_only_its_error(key: bytes | None, value: bytes | None) -> None:
    """Untrusted bytes: decoding never raises anything but `KeyStateDecodeError`."""
    try:
        decode_record(key, value)
    except KeyStateDecodeError:
        pass


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        (b"chain/orders/0/0061", b'{"v":1,"head":5,"frontier":4,"at":0,"followers":0,"since":1}', "frontier"),
        (b"chain/orders/0/0061", b'{"v":3,"head":5,"frontier":5,"at":0,"followers":0,"since":1}', "v"),
        (b"chain/orders/0/0061", b'{"v":2,"head":5,"frontier":5,"at":0,"followers":0,"since":1}', "value"),
        (
            b"chain/orders/0/0061",
            b'{"v":1,"head":5,"frontier":5,"at":0,"followers":0,"since":1,"settled":"succeeded"}',
            "value",
        ),
        (
            b"chain/orders/0/0061",
            b'{"v":2,"head":5,"frontier":5,"at":0,"followers":0,"since":1,"settled":"sent"}',
            "settled",
        ),
        (b"wait/orders/0/0061", b'{"v":1,"since":1}', "key"),
        (b"wait/orders/0/0061/5", b'{"v":2,"since":1}', "v"),
        (b"wait/orders/0/0061/5", b'{"v":1,"since":-2}', "since"),
        (b"wait/orders/0/0061/5", b'{"v":1}', "value"),
        (b"chain/orders/0/0061", b'{"v":1,"head":5,"frontier":5,"at":0,"followers":true,"since":1}', "followers"),
        (b"tier0/orders/0/0061/5", b'{"v":1,"fate":"sent","to":1,"after":6}', "after"),
        (b"tier0/orders/0/0061/5", b'{"v":1,"fate":"succeeded","to":1}', "value"),
        (b"tier0/orders/0/0261/5", b'{"v":1,"fate":"succeeded"}', "key"),
        (b"tier0/orders/0/0061/5", b'{"v":1,"fate":"lost"}', "fate"),
        (b"tier0/orders/0/0061", b'{"v":1,"fate":"succeeded"}', "key"),
        (b"chain/orders/0/0061/5", None, "key"),
        (b"tier0/or|ders/0/0061/5", None, "key"),
        (b"chain/orders/0/0061", b"[1]" + b" " * 600, "value"),
    ],
)
def test_key_state_records_are_validated(key: bytes, value: bytes | None, field: str) -> None:
    """Each malformed record is refused naming what is wrong."""
    with pytest.raises(KeyStateDecodeError) as refused:
        decode_record(key, value)
    assert refused.value.field == field


FOLLOWERS = st.builds(
    Follower,
    original_topic=st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True),
    original_partition=st.integers(0, 2**31 - 1),
    original_offset=st.integers(1, 2**63 - 1),
    original_timestamp=st.integers(-1, 2**63 - 1),
    consumer_group=st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True),
    origin_message_id=st.text(min_size=1, max_size=100).filter(
        lambda s: len(s.encode("utf-8", "surrogatepass")) <= 512 and s.encode("utf-8", "ignore").decode() == s
    ),
    after=st.just(0),
    held_at=st.integers(0, 2**63 - 1),
)


@given(FOLLOWERS)
def test_follower_headers_round_trip(follower: Follower) -> None:
    """A follower's headers read back as written, among user headers; a record without them is no follower."""
    headers = [("tenant", b"t1"), *encode_follower(follower), ("trace", None)]
    assert decode_follower(headers) == follower
    assert decode_follower([("tenant", b"t1")]) is None


@given(
    st.lists(
        st.tuples(
            st.sampled_from([KEY_ORDER_AFTER, "retry.original_offset", "retry.schema_version", "x"]),
            st.binary(max_size=30) | st.none(),
        ),
        max_size=12,
    )
)
def test_malformed_follower_headers_raise_only_header_decode_errors(headers: list[tuple[str, bytes | None]]) -> None:
    """Untrusted headers: decoding raises `HeaderDecodeError` or nothing."""
    try:
        decode_follower(headers)
    except HeaderDecodeError:
        pass


def test_a_follower_waits_behind_an_earlier_record_and_has_never_failed() -> None:
    """`after` must be earlier than the record's own offset, and a follower carries no retry count."""
    follower = Follower(
        original_topic="orders",
        original_partition=0,
        original_offset=7,
        original_timestamp=1,
        consumer_group="billing",
        origin_message_id="orders-0-7",
        after=7,
        held_at=5,
    )
    with pytest.raises(HeaderDecodeError, match="earlier record"):
        decode_follower(encode_follower(follower))
    valid = encode_follower(
        Follower(
            original_topic="orders",
            original_partition=0,
            original_offset=7,
            original_timestamp=1,
            consumer_group="billing",
            origin_message_id="orders-0-7",
            after=3,
            held_at=5,
        )
    )
    with pytest.raises(HeaderDecodeError, match="never failed"):
        decode_follower([*valid, (RECONSUME_TIMES, b"1")])
    with pytest.raises(HeaderDecodeError, match="duplicated"):
        decode_follower([*valid, (KEY_ORDER_AFTER, b"3")])
