"""What a tier or DLQ record says about the failure that sent it there (the `retry.exception_*` headers): the
failure the diagnostics describe (a `Retry` or `NonRetryable` signal is a wrapper: its cause is described),
its type, its redacted message and its trace (retrytopics/core/traces.py), each truncated to its header budget.

Write-only: nothing downstream routes on these texts. Descriptions are cached per failure site and message,
so that records failing alike, as in an outage, are described in a dictionary lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

from retrytopics.core.classify import MAX_CHAIN
from retrytopics.core.errors import NonRetryable, Retry
from retrytopics.core.headers import MESSAGE_LIMIT_BYTES, TRACE_LIMIT_BYTES, TYPE_LIMIT_BYTES, truncate_utf8
from retrytopics.core.traces import Link, format_links, format_trace, keyed_chain, lone_key, lone_link

__all__ = ["Described", "describe", "describe_now", "described_failure"]


def described_failure(failure: BaseException) -> BaseException:
    """The exception the diagnostics describe: the signals `NonRetryable(cause)` and `Retry(...)` raised
    `from exc` (or inside an `except`) are wrappers, so the real failure is their cause. A `Retry` with no
    cause describes itself. Bounded: a chain of wrappers is unwrapped at most `MAX_CHAIN` times."""
    for _ in range(MAX_CHAIN):
        if isinstance(failure, NonRetryable) and isinstance(failure.cause, BaseException):
            inner: BaseException | None = failure.cause
        elif isinstance(failure, Retry):
            # `raise Retry(after=...) from None` asks for no cause, so none is shown
            inner = failure.__cause__ or (None if failure.__suppress_context__ else failure.__context__)
        else:
            inner = None
        if inner is None or inner is failure:
            return failure
        failure = inner
    return failure


class Described(NamedTuple):
    """What the `retry.exception_*` headers say about a failure."""

    exception_type: str
    exception_message: str
    exception_trace: str


def describe(failure: BaseException, redact: Callable[[str], str]) -> Described:
    """Write-only diagnostics: type, redacted message and trace, truncated to their header budgets. Cached
    per failure site and message (`traces.keyed_chain`): when many records fail alike, as in an outage,
    each is described in a dictionary lookup."""
    failure = described_failure(failure)
    keyed: tuple[tuple[object, ...], list[Link] | None] | None
    if failure.__cause__ is None and failure.__context__ is None:  # most failures: one exception, no chain
        lone = lone_key(failure)  # its frames are read only when it is described for the first time
        keyed = None if lone is None else (lone, None)
    else:
        keyed = keyed_chain(failure)
    if keyed is None:
        return describe_now(failure, redact)
    key, links = keyed
    site = (key, redact)
    # a read needs no lock: a dict lookup is atomic, and entries are only ever replaced whole
    described = _described.get(site)
    if described is None:  # a new site or message (often: messages that name the record): from the links
        if links is None:
            links = [lone_link(failure, key)]
        described = _described_as(type(failure), links[-1].text, format_links(links, redact=redact), redact)
        with _described_lock:
            if len(_described) >= _DESCRIBED_CACHE_SIZE:
                del _described[next(iter(_described))]  # the oldest: a plain dict keeps insertion order
            _described[site] = described
    return described


def describe_now(failure: BaseException, redact: Callable[[str], str]) -> Described:
    cls = type(failure)
    try:
        message = str(failure)
        trace = format_trace(failure, redact=redact)
    except Exception:  # noqa: BLE001 - a broken __str__ must not stop the record from moving on
        message, trace = f"<unprintable {cls.__name__}>", ""
    return _described_as(cls, message, trace, redact)


def _described_as(cls: type[BaseException], message: str, trace: str, redact: Callable[[str], str]) -> Described:
    return Described(
        exception_type=truncate_utf8(f"{cls.__module__}.{cls.__qualname__}", TYPE_LIMIT_BYTES),
        exception_message=truncate_utf8(redact(message), MESSAGE_LIMIT_BYTES),
        exception_trace=truncate_utf8(trace, TRACE_LIMIT_BYTES, keep="tail"),
    )


_DESCRIBED_CACHE_SIZE = 1024
_described: dict[tuple[object, Callable[[str], str]], Described] = {}
_described_lock = threading.Lock()
