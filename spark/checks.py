"""Is a DLQ record safe to replay? The tier consumers' strict header checks, as Spark SQL over the typed columns.

A DLQ record's headers are untrusted input: anyone who can write to the DLQ can forge them. The replay
writes a record to `retry.original_partition` of the source, copies its retry state into a tier's headers and
adds one to `retry.replay_count`, so one forged record (partition 999, a count of 2^31-1) would fail the
whole job halfway. Each record gets the first problem found, or NULL::

    dlq.withColumn("problem", problem(source_partitions=6))

The bounds are those of `retrytopics.core.headers` (what `headers.decode` accepts on a tier), plus: a count that
one more replay would overflow, and a partition that the source topic does not have. A `blocked_by_key` record
(a key-ordered handler's follower dead-lettered behind its key's dead-lettered record) never ran: its
`reconsume_times` may be 0, no other's.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column
from pyspark.sql import functions as F

from retrytopics.core import headers as H

__all__ = ["PROBLEMS", "headers_dropped", "problem", "problem_sql", "reference_only"]

_INT32: Final = 2**31 - 1
_TOPIC: Final = "^[a-zA-Z0-9._-]{1,249}$"


def _present(header: str) -> str:
    return f"array_contains(headers.key, '{header}')"


def _text_bounds(column: str, low: int, high: int) -> str:
    return f"{column} IS NULL OR octet_length({column}) NOT BETWEEN {low} AND {high}"


def _checks(source_partitions: int) -> dict[str, str]:
    """Problem name → SQL condition that holds when the record has it (in the order they are reported).
    A typed column is NULL when its header is missing, repeated or not canonical (spark/columns.py)."""
    reasons = ", ".join(f"'{r.value}'" for r in H.DlqReason)
    return {
        "headers": f"headers IS NULL OR size(headers) > {H.MAX_HEADER_COUNT}",
        "schema_version": "schema_version IS NULL OR schema_version != 1",
        "origin_message_id": _text_bounds("origin_message_id", 1, 512),
        "original_partition": f"original_partition IS NULL OR original_partition NOT BETWEEN 0 AND {source_partitions - 1}",
        "original_offset": "original_offset IS NULL OR original_offset < 0",
        "original_timestamp": "original_timestamp IS NULL OR unix_millis(original_timestamp) < -1",  # -1: none
        "consumer_group": f"consumer_group IS NULL OR NOT consumer_group RLIKE '{_TOPIC}'",
        # 0 only for a record that never ran: one dead-lettered behind its key's dead-lettered record
        "reconsume_times": "reconsume_times IS NULL OR reconsume_times < "
        f"CASE WHEN dlq_reason = '{H.DlqReason.BLOCKED_BY_KEY.value}' THEN 0 ELSE 1 END",
        "failed_at": "first_failed_at IS NULL OR last_failed_at IS NULL OR unix_millis(first_failed_at) < 0 "
        "OR first_failed_at > last_failed_at",
        "tier": f"{_present(H.TIER)} OR {_present(H.DUE_AT)}",  # a DLQ record has neither
        "exception_type": _text_bounds("exception_type", 1, H.TYPE_LIMIT_BYTES),
        "exception_message": _text_bounds("exception_message", 0, H.MESSAGE_LIMIT_BYTES),
        "exception_trace": _text_bounds("exception_trace", 0, H.TRACE_LIMIT_BYTES),
        "dlq_reason": f"dlq_reason IS NULL OR dlq_reason NOT IN ({reasons})",
        # One more replay must still fit in an int; a present but unreadable count is not "never replayed".
        "replay_count": f"CASE WHEN replay_count IS NULL THEN {_present(H.REPLAY_COUNT)} "
        f"ELSE replay_count < 0 OR replay_count >= {_INT32} END",
    }


#: Every problem name a replay can report (keys of `skipped_invalid_by_problem`).
PROBLEMS: Final = tuple(_checks(1))


def problem_sql(source_partitions: int) -> str:
    """SQL for the record's first problem (its name), or NULL when it is safe to replay."""
    if source_partitions < 1:
        raise ValueError(f"source_partitions must be >= 1, got {source_partitions}")
    # An unknown answer (NULL) counts as a problem: only a record shown to be valid is replayed.
    checks = _checks(source_partitions).items()
    cases = " ".join(f"WHEN coalesce({condition}, true) THEN '{name}'" for name, condition in checks)
    return f"CASE {cases} END"


def problem(source_partitions: int) -> Column:
    """`problem_sql` as a column (needs the typed retry columns with `exception_trace`, and `headers`)."""
    return F.expr(problem_sql(source_partitions))


def reference_only() -> Column:
    """True for a `too_large` DLQ record whose value is only a reference to the record (the runtime's last
    resort when even a DLQ record without exception details was too large: `router.too_large_reference`,
    `{"too_large":true,"topic":...,"partition":...,"offset":...,"value_bytes":...}`, naming the consumed
    record, which may be a tier's). Its value is not the record's, so a replay must not write it; never NULL.
    Recognised by the reason and the reference's shape, so a record whose own value happens to be JSON is
    not mistaken for one unless it has every field of a reference."""
    value = "CAST(value AS STRING)"
    fields = " AND ".join(
        f"get_json_object({value}, '$.{name}') IS NOT NULL" for name in ("topic", "partition", "offset", "value_bytes")
    )
    return F.expr(
        f"coalesce(dlq_reason = '{H.DlqReason.TOO_LARGE.value}' "
        f"AND get_json_object({value}, '$.too_large') = 'true' AND {fields}, false)"
    )


def headers_dropped() -> Column:
    """True for a `too_many_headers` DLQ record: it keeps the record's key and value but not its user headers
    (more than any hop can carry), so writing it back would hand the handler a different record; never NULL."""
    return F.expr(f"coalesce(dlq_reason = '{H.DlqReason.TOO_MANY_HEADERS.value}', false)")
