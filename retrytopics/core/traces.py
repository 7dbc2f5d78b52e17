"""Exception traces for the DLQ's `retry.exception_trace` header, formatted cheaply.

Pure: standard library only. The text reads like `traceback.format_exception` (the cause chain, each stack
oldest call first, then the exception line) without the `^^^` caret lines: on Python 3.11 those make
`traceback` parse every frame's source with `ast`, for every failure (bench/findings.md, section 2). Records
that fail at the same place share one stack
text, so the stack part is formatted once per failure site and cached; only the exception lines (which
carry per-record messages) are formatted each time.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from types import CodeType, FrameType
from typing import NamedTuple

__all__ = ["Link", "format_links", "format_trace", "keyed_chain", "lone_key", "lone_link"]

_CHAIN_LIMIT = 32
_SITE_CACHE_SIZE = 512
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"

# the redactor is part of the key: two apps with different patterns must not share a redacted text
_Site = tuple[type[BaseException], tuple[tuple[CodeType, int], ...], Callable[[str], str]]
#: oldest first (a plain dict keeps insertion order): a site pushed out by many new ones is formatted again
_sites: dict[_Site, str] = {}
_sites_lock = threading.Lock()


def _chain(failure: BaseException) -> list[tuple[BaseException, str]]:
    """(exception, the separator printed after it), oldest first, as `traceback` orders a chain."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = failure
    separator = ""
    while current is not None and id(current) not in seen and len(chain) < _CHAIN_LIMIT:
        seen.add(id(current))
        chain.append((current, separator))
        if current.__cause__ is not None:
            current, separator = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, separator = current.__context__, _CONTEXT
        else:
            current = None
    return list(reversed(chain))


def _stack_text(exc: BaseException, redact: Callable[[str], str]) -> str:
    if exc.__traceback__ is None:
        return ""
    frames = list(traceback.walk_tb(exc.__traceback__))
    return _site_text(type(exc), tuple((frame.f_code, lineno) for frame, lineno in frames), frames, redact)


def _site_text(
    cls: type[BaseException],
    where: tuple[tuple[CodeType, int], ...],
    frames: list[tuple[FrameType, int]],
    redact: Callable[[str], str],
) -> str:
    """The stack text of `frames` (whose (code, line) are `where`), formatted once per failure site."""
    if not frames:
        return ""
    site: _Site = (cls, where, redact)
    # a read needs no lock: a dict lookup is atomic, and entries are only ever added or removed whole
    cached = _sites.get(site)
    if cached is not None:
        return cached
    # walk_tb gives no column positions, so StackSummary prints no carets and never parses source
    text = redact(
        "Traceback (most recent call last):\n" + "".join(traceback.StackSummary.extract(iter(frames)).format())
    )
    with _sites_lock:
        _sites[site] = text
        if len(_sites) > _SITE_CACHE_SIZE:
            del _sites[next(iter(_sites))]
    return text


def _exception_text(exc: BaseException) -> str:
    """`traceback.format_exception_only`, built directly in the common case (no SyntaxError, no notes),
    where traceback builds a whole TracebackException for one line."""
    cls = type(exc)
    if issubclass(cls, SyntaxError) or getattr(exc, "__notes__", None) is not None:
        return "".join(traceback.format_exception_only(cls, exc))
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - traceback prints the same placeholder
        text = "<exception str() failed>"
    return _exception_line(cls, text)


def _exception_line(cls: type[BaseException], text: str) -> str:
    name, module = cls.__qualname__, cls.__module__
    if module not in ("__main__", "builtins"):
        name = f"{module if isinstance(module, str) else '<unknown>'}.{name}"
    return f"{name}: {text}\n" if text else f"{name}\n"


class Link(NamedTuple):
    """One exception of a failure's chain, read once: its text and where it was raised."""

    exc: BaseException
    separator: str  # printed after it (see `_chain`)
    text: str  # str(exc)
    where: tuple[tuple[CodeType, int], ...]  # (code, line) of each frame: with the type, the failure site
    frames: list[tuple[FrameType, int]]


def keyed_chain(failure: BaseException) -> tuple[tuple[object, ...], list[Link]] | None:
    """The chain of `failure` (oldest first), each link's text and stack read once, and its key: per link
    its type, text, site and separator, what the description depends on (records that fail at one place
    with one message share a key, so their description can be cached). None when the text cannot be keyed
    this way (a SyntaxError prints its own attributes, notes are mutable, a broken `__str__`): such failures
    are described each time, by `format_trace`."""
    if failure.__cause__ is None and failure.__context__ is None:  # most failures: one exception, no chain
        link = _link(failure, "")
        return None if link is None else ((type(failure), link.text, link.where, ""), [link])
    key: list[object] = []
    links: list[Link] = []
    for exc, separator in _chain(failure):
        link = _link(exc, separator)
        if link is None:
            return None
        key += (type(exc), link.text, link.where, separator)
        links.append(link)
    return tuple(key), links


def lone_key(failure: BaseException) -> tuple[object, ...] | None:
    """`keyed_chain(failure)`'s key for a failure with no cause or context (the caller checks), read without
    the frames a description is formatted from: all a failure described before needs."""
    if isinstance(failure, SyntaxError) or getattr(failure, "__notes__", None) is not None:
        return None
    try:
        text = str(failure)
    except Exception:  # noqa: BLE001 - described the slow way, which prints a placeholder
        return None
    where: list[tuple[CodeType, int]] = []
    tb = failure.__traceback__
    while tb is not None:
        where.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return (type(failure), text, tuple(where), "")


def lone_link(failure: BaseException, key: tuple[object, ...]) -> Link:
    """The Link of a lone failure whose `lone_key` is `key`: its text and site taken from the key, its frames
    read (a failure described for the first time is not read twice)."""
    frames: list[tuple[FrameType, int]] = []
    tb = failure.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return _new_link(Link, (failure, "", key[1], key[2], frames))


def _link(exc: BaseException, separator: str) -> Link | None:
    """`exc` read once (None: it cannot be keyed, see `keyed_chain`)."""
    if isinstance(exc, SyntaxError) or getattr(exc, "__notes__", None) is not None:
        return None
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - described the slow way, which prints a placeholder
        return None
    frames: list[tuple[FrameType, int]] = []
    where: list[tuple[CodeType, int]] = []
    tb = exc.__traceback__
    while tb is not None:  # traceback.walk_tb, without a generator per exception
        frames.append((tb.tb_frame, tb.tb_lineno))
        where.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return _new_link(Link, (exc, separator, text, tuple(where), frames))  # (NamedTuple.__new__ is Python code)


_new_link = tuple.__new__


def format_links(links: list[Link], *, redact: Callable[[str], str] = lambda text: text) -> str:
    """`format_trace` of a keyed chain, from what `keyed_chain` read (nothing is read twice)."""
    parts: list[str] = []
    for link in links:
        parts.append(_site_text(type(link.exc), link.where, link.frames, redact))
        parts.append(redact(_exception_line(type(link.exc), link.text)))
        parts.append(link.separator)
    return "".join(parts)


def format_trace(failure: BaseException, *, redact: Callable[[str], str] = lambda text: text) -> str:
    """The trace of `failure` and its cause/context chain, with `redact` applied to every part."""
    parts: list[str] = []
    for exc, separator in _chain(failure):
        parts.append(_stack_text(exc, redact))
        parts.append(redact(_exception_text(exc)))
        parts.append(separator)
    return "".join(parts)
