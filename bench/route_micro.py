"""``python -m bench.route_micro [--repeats 7] [--calls 20000]``: the pure core's failure path alone, in CPU time.

Times `route()` on what the `2.failure` scenario routes (policy ``delays=["1h"]``, a lone `RuntimeError` raised
two frames deep, a source record with two user headers), the same with a message that names the record (a new
text per record, as the peer scenario's handler raises), plus a tier record's second failure (its state read
first, as the runtime does) and a dead-lettered one. Prints the minimum over the repeats of the CPU time per
call: the minimum is the run the machine's neighbours disturbed least.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from collections.abc import Callable

from retrytopics.core.headers import encode
from retrytopics.core.naming import topics_for
from retrytopics.core.policy import RetryPolicy
from retrytopics.core.router import InboundRecord, RouteContext, read_retry_state, route

__all__ = ["main"]


def _fail(record_id: int) -> None:
    raise RuntimeError("fails once")


def _fail_naming(record_id: int) -> None:
    raise RuntimeError(f"id {record_id} failed")  # as the peer scenario's handler: a new message per record


def _handler(record_id: int, fail: Callable[[int], None] = _fail) -> None:
    fail(record_id)


def _caught(fail: Callable[[int], None] = _fail, record_id: int = 0) -> BaseException:
    try:
        _handler(record_id, fail)
    except RuntimeError as exc:
        return exc
    raise AssertionError("the handler did not raise")


def _naming(count: int) -> Callable[[], BaseException]:
    """Failures whose messages name their record, `count` of them in turn: more than the description cache
    holds, so each is described anew."""
    failures = itertools.cycle([_caught(_fail_naming, i) for i in range(count)])
    return lambda: next(failures)


def _cases() -> dict[str, Callable[[], object]]:
    policy = RetryPolicy(delays=["1m", "1h"])
    ctx = RouteContext(policy=policy, topics=topics_for("orders", "billing", policy.tier_delays_ms), group="billing")
    last = RouteContext(
        policy=RetryPolicy(delays=["1m", "1h"], max_retries=1),
        topics=topics_for("orders", "billing", policy.tier_delays_ms),
        group="billing",
    )
    failure, rng, now = _caught(), random.Random(7), 1_700_000_000_000
    users = (("trace-id", b"4bf92f3577b34da6"), ("content-type", b"application/json"))
    source = InboundRecord(topic="orders", partition=3, offset=12_345, timestamp_ms=now - 5, key=b"k1", headers=users)
    first = route(ctx, source, failure, now_ms=now, rng=rng)
    tier = InboundRecord(
        topic=first.topic, partition=0, offset=77, timestamp_ms=now, key=b"k1", headers=(*users, *encode(first.retry))
    )
    later = now + 60_000
    state = read_retry_state(ctx, tier, now_ms=later)
    dlq_state = read_retry_state(last, tier, now_ms=later)
    naming = _naming(20_000)
    return {
        "route, source record (first failure)": lambda: route(ctx, source, failure, now_ms=now, rng=rng, previous=None),
        "route, source record, a message naming the record": lambda: route(
            ctx, source, naming(), now_ms=now, rng=rng, previous=None
        ),
        "route, tier record (second failure)": lambda: route(ctx, tier, failure, now_ms=later, rng=rng, previous=state),
        "route, to the DLQ (exhausted)": lambda: route(last, tier, failure, now_ms=later, rng=rng, previous=dlq_state),
        "read_retry_state, tier record": lambda: read_retry_state(ctx, tier, now_ms=later),
    }


def _per_call_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.route_micro", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args(argv)
    for name, call in _cases().items():
        print(f"{name}: {_per_call_us(call, args.calls, args.repeats):.2f} µs")


if __name__ == "__main__":
    main()
