"""Who may act in the console: operators log in with the console's token and get a session; every action
form carries the session's CSRF token.

Pure (the clock is an argument). The browser never receives the token: only a random session id, in an
HttpOnly, SameSite=Strict cookie, and the session's CSRF token, in the action forms. Sessions are few and
short-lived; the oldest goes when the table is full. Wrong tokens are limited: after a few within a minute,
logins wait.
"""

from __future__ import annotations

import hmac
import secrets
from collections import deque
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

    def __init__(
        self,
        token: str,
        *,
        clock: Callable[[], float],
        ttl_s: float = 8 * 3600,
        limit: int = 64,
        failures_allowed: int = 5,
        failure_window_s: float = 60.0,
    ) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError("console.token", "[hidden]", f"at least {MIN_TOKEN_CHARS} characters")
        self._token = token.encode()
        self._clock = clock
        self._ttl_s = ttl_s
        self._limit = limit
        self._sessions: dict[str, Session] = {}
        self._failures: deque[float] = deque(maxlen=failures_allowed)
        self._failure_window_s = failure_window_s

    def login_blocked_for(self) -> float:
        """Seconds until a login may be tried again (0: now): after `failures_allowed` wrong tokens within
        `failure_window_s`, every login waits until the oldest of them is that old. One limit for every client:
        a console serves a few operators, and guessing from many addresses must not multiply the tries."""
        if len(self._failures) < (self._failures.maxlen or 0):
            return 0.0
        return max(0.0, self._failures[0] + self._failure_window_s - self._clock())

    def login(self, operator: str, token: str) -> Session | None:
        """A new session when `token` is the console's, else None."""
        if not hmac.compare_digest(self._token, token.encode("utf-8", "replace")):
            self._failures.append(self._clock())
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
