"""Exactly-once settings chosen and checked at start-up: how long a transaction may stay open, and the
stable part of its transactional id.

Pure: standard library only.

A transaction is open on the broker from its first hand-off until its batch's commit, so at most one poll
batch plus the calls that commit it: a batch must end within `max.poll.interval.ms` (past it the member
leaves its group and the transaction can only abort), and each transactional call times out after
`CALL_TIMEOUT_MS` (runtime/handoff/transactional.py). `transaction.timeout.ms` must cover both, or the broker
aborts a transaction that was still legitimately open and the batch is read again, forever. (A commit asked
again across a coordinator's failover may take longer; the broker's abort then ends it cleanly.) It is also the
longest a crashed process's open transaction holds back read_committed readers of the topics it wrote,
unless a process with the same transactional id starts and fences it at once (a stable `instance_id`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from retrytopics.core.errors import ConfigError

__all__ = [
    "CALL_TIMEOUT_MS",
    "EXACTLY_ONCE_MAX_POLL_INTERVAL_MS",
    "INSTANCE_ID_ENV",
    "default_instance_id",
    "transaction_timeout_ms",
]

#: exactly-once consumers' default `max.poll.interval.ms`: a poll batch, and so a transaction, ends within it
EXACTLY_ONCE_MAX_POLL_INTERVAL_MS = 20_000

#: the timeout of each blocking client call a consumer loop makes (a topic's metadata; a transactional call:
#: sending the offsets, committing, aborting, which is abandoned 1 s later, with its producer, if librdkafka
#: does not keep it: runtime/handoff/transactional.py)
CALL_TIMEOUT_MS = 5_000

#: the commit of a batch takes two calls: its offsets, then the commit itself
_COMMIT_CALLS = 2

#: the broker's default `transaction.max.timeout.ms`: a producer asking for more is refused at start
_BROKER_MAX_TIMEOUT_MS = 900_000

#: the environment variable that names this process for its transactional ids, before HOSTNAME
INSTANCE_ID_ENV = "RETRYTOPICS_INSTANCE_ID"


def transaction_timeout_ms(max_poll_interval_ms: int, producer: Mapping[str, Any]) -> int:
    """The producer's `transaction.timeout.ms`: as given in `producer`, which must cover a batch and its
    commit, or by default exactly that (`max_poll_interval_ms` + two call timeouts). Raises `ConfigError`
    naming the field that does not fit."""
    needed = max_poll_interval_ms + _COMMIT_CALLS * CALL_TIMEOUT_MS
    given = producer.get("transaction.timeout.ms")
    if given is None:
        if needed > _BROKER_MAX_TIMEOUT_MS:
            raise ConfigError(
                "max.poll.interval.ms",
                max_poll_interval_ms,
                f"exactly-once needs transaction.timeout.ms above it plus {_COMMIT_CALLS * CALL_TIMEOUT_MS}"
                f" ms for the commit calls, and brokers allow at most {_BROKER_MAX_TIMEOUT_MS} ms "
                "by default (transaction.max.timeout.ms)",
            )
        return needed
    try:
        timeout = int(given)
    except (TypeError, ValueError):
        raise ConfigError("transaction.timeout.ms", given, "expected a number of ms") from None
    if timeout < needed:
        raise ConfigError(
            "transaction.timeout.ms",
            timeout,
            f"must be at least max.poll.interval.ms ({max_poll_interval_ms}) + {_COMMIT_CALLS} x "
            f"{CALL_TIMEOUT_MS} ms for the commit calls = {needed}: a transaction stays open for up to a poll batch "
            "and its commit, and the broker would abort it while still in use (then the batch is read again, "
            "forever); lower max.poll.interval.ms or raise transaction.timeout.ms",
        )
    return timeout


def default_instance_id(environ: Mapping[str, str], random_id: Callable[[], str]) -> str:
    """This process's name in its transactional ids (`<consumer group>-<instance_id>`) when the app is given
    none: `RETRYTOPICS_INSTANCE_ID`, else `HOSTNAME` as containers and Kubernetes set it (the pod name),
    else `random_id()`. Stable across restarts, a restarted process fences its crashed predecessor's open
    transaction at once. Two processes running the same consumer with the same id fence each other: on
    one host without a container each, give each process its own `RETRYTOPICS_INSTANCE_ID`."""
    for name in (INSTANCE_ID_ENV, "HOSTNAME"):
        value = environ.get(name, "").strip()
        if value:
            return value
    return random_id()
