"""Key-ordered retries, the pure core: which records of a key wait, where, and when they may run.

Pure: standard library and the pure core only, no clock of its own, no I/O. The design, its failure cases and its
costs are in docs/key-ordering.md; in one paragraph: a record whose key has an earlier record of the same
source partition still in the retry chain (a *blocked* key) is not handled but handed off as a *follower*
behind the key's last record, into the same tier (same key, so the same partition: Kafka's partition order is
the lock). Whoever reads a follower has read its predecessor first, so it knows the predecessor's fate: handled
(the follower runs), dead-lettered (the policy says), or sent on to tier Y (the follower follows it there).
What each consumer knows is also written to a compacted key-state topic, so a new owner of a partition knows
it before it reads anything::

    chains = SourceChains(KeyOrdering(), source="orders", partition=0)
    k = key_id(b"acct-7")
    chains.admit(k)                                   # Admission(HANDLE): the key is not blocked
    chains.handed_off(k, 41, now_ms=t)                # its handler failed; the router sent it to a tier
    chains.admit(k)                                   # Admission(WAIT): until that hop is acknowledged
    chains.acked(k, 41, landed=0)                     # Chain(head=41, frontier=41, at_tier=0, ...): write it
    chains.admit(k)                                   # Admission(FOLLOW, tier=0, after=41)

One concept per module:

- `config`: `KeyOrdering` (a handler's setting) and `DeadHeadPolicy`;
- `keys`: how a key (`key_id`) and one ordered sequence (`ChainKey`) are named;
- `state_records`: the key-state topic's records and their codec (`Chain`, `Passage`, `Closed`);
- `follower`: the follower headers and their codec;
- `bounds`: the limits both codecs check untrusted bytes against;
- `source_chains`: the main consumer's state machine (`SourceChains`, `Admission`, `batch_end`);
- `tier_passages`: the tier consumer's state machine (`TierPassages`, `TierDecision`);
- `hops`: the hops key order adds to a record's path (a follower's headers, a ``blocked_by_key`` DLQ route).

The runtime's part (the consumer loop's admission step, hold reason and hand-off listener) is
`retrytopics/runtime/keyorder/`; the Spark audit's is `spark/key_order.py`.
"""
