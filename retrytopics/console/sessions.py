"""Who may act in the console: operators log in with the console's token and get a session; every action
form carries the session's CSRF token.

Pure (the clock is an argument). The browser never receives the token: only a random session id, in an
HttpOnly, SameSite=Strict cookie, and the session's CSRF token, in the action forms. Sessions are few and
short-lived; the oldest goes when the table is full.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from retrytopics.core.errors import ConfigError

__all__ = ["MIN_TOKEN_CHARS", "Session", "Sessions", "operator_name"]

MIN_TOKEN_CHARS: Final = 16
_MAX_OPERATOR_CHARS: Final = 64


def operator_name(text: str) -> str:
    """The operator's name as typed at login, checked: it goes to the action log."""
    name = text.strip()
    if not 0 < len(name) <= _MAX_OPERATOR_CHARS or not name.isprintable():
        raise ConfigError("operator", name[:_MAX_OPERATOR_CHARS], f"1 to {_MAX_OPERATOR_CHARS} printable characters")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    sid: str
    csrf: str
    operator: str
    created_s: float

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(self.csrf.encode(), given.encode("utf-8", "replace"))


class Sessions:
    """Logged-in operators, for a console started with actions and a token."""

    def __init__(self, token: str, *, clock: Callable[[], float], ttl_s: float = 8 * 3600, limit: int = 64) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError("console.token", "[hidden]", f"at least {MIN_TOKEN_CHARS} characters")
        self._token = token.encode()
        self._clock = clock
        self._ttl_s = ttl_s
        self._limit = limit
        self._sessions: dict[str, Session] = {}

    def login(self, operator: str, token: str) -> Session | None:
        """A new session when `token` is the console's, else None."""
        if not hmac.compare_digest(self._token, token.encode("utf-8", "replace")):
            return None
        now = self._clock()
        self._sessions = {sid: s for sid, s in self._sessions.items() if now - s.created_s < self._ttl_s}
        while len(self._sessions) >= self._limit:
            del self._sessions[min(self._sessions, key=lambda sid: self._sessions[sid].created_s)]
        session = Session(
            sid=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            operator=operator_name(operator),
            created_s=now,
        )
        self._sessions[session.sid] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        session = self._sessions.get(sid or "")
        if session is None or self._clock() - session.created_s >= self._ttl_s:
            return None
        return session

    def logout(self, sid: str | None) -> None:
        self._sessions.pop(sid or "", None)
