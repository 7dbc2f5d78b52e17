"""Traces for the DLQ header read like Python's own (chain order, separators, per-record messages),
without carets, and redacted; the cached stack never leaks one record's message into another's."""

from __future__ import annotations

import traceback
from collections.abc import Callable

import pytest

from retrytopics.core.headers import redact
from retrytopics.core.traces import format_trace


def _fail(message: str) -> BaseException:
    def gateway() -> None:
        raise TimeoutError(message)

    def charge() -> None:
        try:
            gateway()
        except TimeoutError as exc:
            raise RuntimeError("charge failed") from exc

    try:
        charge()
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def _without_carets(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and set(line.strip()) - set("^~")]


def test_same_lines_as_traceback_without_carets() -> None:
    failure = _fail("order 1 timed out")
    assert _without_carets(format_trace(failure)) == _without_carets("".join(traceback.format_exception(failure)))
    assert "^" not in format_trace(failure)


def test_each_record_keeps_its_own_message_although_the_stack_is_cached() -> None:
    first, second = format_trace(_fail("order 1 timed out")), format_trace(_fail("order 2 timed out"))
    assert "order 1" in first and "order 2" not in first
    assert "order 2" in second and "order 1" not in second


def test_redaction_applies_to_messages_and_stack() -> None:
    text = format_trace(_fail("upstream said password=hunter2"), redact=redact)
    assert "hunter2" not in text and "password=[hidden]" in text


def test_suppressed_context_and_cycles_are_handled() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise ValueError("outer") from None
    except ValueError as exc:
        outer = exc
    assert "KeyError" not in format_trace(outer)
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a  # a cycle must not loop
    assert "ValueError: a" in format_trace(a)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def _with_note() -> BaseException:
    exc = ValueError("with a note")
    exc.add_note("first\nsecond")
    return exc


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad"),
        ValueError(),
        KeyError("k"),
        OSError(2, "gone"),
        RuntimeError("two\nlines"),
        _Unprintable(),
        _with_note(),
        SyntaxError("bad syntax", ("f.py", 1, 2, "x y")),
        TimeoutError(""),
        ExceptionGroup("g", [ValueError()]),
        type("Local", (Exception,), {"__module__": "__main__"})("in main"),
    ],
)
def test_the_exception_line_is_tracebacks_own(exc: BaseException) -> None:
    from retrytopics.core.traces import _exception_text

    assert _exception_text(exc) == "".join(traceback.format_exception_only(type(exc), exc))


def _in_except() -> BaseException:
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise ValueError("outer, during handling")  # noqa: B904 - the implicit context is the point
    except ValueError as exc:
        return exc


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the test wants the traceback attached
        return caught


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad"),
        RuntimeError("two\nlines"),
        _with_note(),
        SyntaxError("bad syntax", ("f.py", 1, 2, "x y")),
        _Unprintable(),
        ExceptionGroup("g", [ValueError()]),
        _fail("order 3 timed out"),
        _in_except(),
    ],
)
def test_the_description_cache_answers_what_describing_anew_would(exc: BaseException) -> None:
    from retrytopics.core.diagnostics import describe, describe_now

    failure = _raised(exc)
    fresh = describe_now(failure, redact)
    assert describe(failure, redact) == fresh
    assert describe(failure, redact) == fresh  # the second time from the cache, where the key allows one


def _key(failure: BaseException) -> tuple[object, ...] | None:
    from retrytopics.core.traces import keyed_chain

    keyed = keyed_chain(failure)
    return None if keyed is None else keyed[0]


def test_records_failing_alike_share_a_key_and_others_do_not() -> None:
    assert _key(_fail("order 1 timed out")) == _key(_fail("order 1 timed out"))
    assert _key(_fail("order 1 timed out")) != _key(_fail("order 2 timed out"))
    assert _key(_raised(ValueError("x"))) != _key(_raised(KeyError("x")))
    # what the text cannot be keyed on is described each time
    assert _key(_raised(_with_note())) is None and _key(_raised(_Unprintable())) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: _fail("order 7 timed out"),
        _in_except,
        lambda: _raised(ValueError("v")),
        lambda: ValueError("never raised"),
    ],
)
def test_a_keyed_chain_formats_exactly_as_the_failure_does(make: Callable[[], BaseException]) -> None:
    # the description of a new site or message is built from what keyed_chain read, not read again
    from retrytopics.core.traces import format_links, keyed_chain

    failure = make()
    keyed = keyed_chain(failure)
    assert keyed is not None
    links = keyed[1]
    assert format_links(links) == format_trace(failure)
    assert format_links(links, redact=redact) == format_trace(failure, redact=redact)


def test_the_cache_keeps_each_records_message_and_each_apps_redaction() -> None:
    from retrytopics.core.diagnostics import describe
    from retrytopics.core.redaction import Redactor

    first, second = describe(_fail("order 1 timed out"), redact), describe(_fail("order 2 timed out"), redact)
    assert "order 1" in first.exception_trace and "order 2" in second.exception_trace
    cards = Redactor.with_patterns([r"order \d"])
    assert "order 1" not in describe(_fail("order 1 timed out"), cards).exception_trace
    assert "order 1" in describe(_fail("order 1 timed out"), redact).exception_trace


@pytest.mark.parametrize(
    "make",
    [
        lambda: _raised(ValueError("v")),
        lambda: _raised(TimeoutError("order 7 timed out")),
        lambda: ValueError("never raised"),
        lambda: _raised(_with_note()),
        lambda: _raised(SyntaxError("bad syntax", ("f.py", 1, 2, "x y"))),
        lambda: _raised(_Unprintable()),
    ],
)
def test_a_lone_failure_is_looked_up_by_the_key_its_chain_has(make: Callable[[], BaseException]) -> None:
    """A failure with no cause or context is looked up in the description cache by `lone_key`, which must be
    the key `keyed_chain` files it under (or None where that is None)."""
    from retrytopics.core.traces import lone_key

    failure = make()
    assert failure.__cause__ is None and failure.__context__ is None
    assert lone_key(failure) == _key(failure)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _raised(ValueError("v")),
        lambda: _raised(TimeoutError("order 7 timed out")),
        lambda: ValueError("never raised"),
    ],
)
def test_a_lone_failure_described_for_the_first_time_has_the_link_its_chain_has(
    make: Callable[[], BaseException],
) -> None:
    """A lone failure not described before is formatted from `lone_link`, which takes its text and site from
    the key it was looked up by: the same Link `keyed_chain` reads, and the same trace as formatting anew."""
    from retrytopics.core.traces import format_links, keyed_chain, lone_key, lone_link

    failure = make()
    key, keyed = lone_key(failure), keyed_chain(failure)
    assert key is not None and keyed is not None
    link = lone_link(failure, key)
    assert link == keyed[1][0]
    assert format_links([link], redact=redact) == format_trace(failure, redact=redact)
