"""Hide credentials in exception messages and traces before they are written to tier and DLQ headers.

Pure: standard library only. DLQ readers are not secret holders, and a failure's text often carries a
connection string, a request's headers or a config dict. The built-in patterns cover the common forms::

    redact('login failed: {"password": "hunter2"} at redis://:pw@cache')
    # 'login failed: {"password": "[hidden]"} at redis://[hidden]@cache'

They lean towards hiding too much: a value is hidden up to the next whitespace or closing quote, a URL's
whole user-info part is hidden, a private key block to its END line (or to the end of a cut text). Users
add their own with :class:`Redactor` (``RetryApp(redact_patterns=[...])``); a pattern hides its whole match,
or only its ``secret`` group when it has one::

    hide = Redactor.with_patterns([r"ssn=(?P<secret>\\d+)", r"\\bAKIA[0-9A-Z]{16}\\b"])
    hide("ssn=123 key AKIAIOSFODNN7EXAMPLE")   # 'ssn=[hidden] key [hidden]'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from retrytopics.core.errors import ConfigError

__all__ = ["HIDDEN", "Redactor", "redact", "redact_header"]

HIDDEN: Final = "[hidden]"

#: Key names whose value is a secret, as a whole word or a segment of a longer key (`access_token`,
#: `aws_secret_access_key`, `sasl.password`, `x-api-key`, `clientSecret`, `PGPASSWORD`).
_SECRET_WORDS: Final = (
    r"password|passwd|pwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|account[_-]?key"
    r"|authorization|credentials?|session[_-]?id"
)
#: Short names that are secrets only as a whole segment (`pass`, `db.pw`, a SAS URL's `sig`), never inside a
#: longer word (`compass`, `bypass`, `design`).
_SHORT_SECRET_WORDS: Final = r"pass|pw|sig"
_KEY: Final = re.compile(
    # The key is taken whole and possessively (no backtracking inside it: a long run of `token_token_...`
    # would be quadratic); whether it names a secret is checked afterwards (`_names_a_secret`), and only
    # then is its value matched, so `a=a=a=...` costs one pass too.
    r"(?<![\w.-])(?P<key>[\w.-]++)"
    # `=`, `: `, Ruby's `=>`, a URL-encoded `=` or `:`, or the closing quote of a JSON or dict key first
    r"(?P<sep>\\?['\"]?\s*(?:=>|[:=]|%3[aAdD])\s*)"
)
_VALUE: Final = re.compile(
    r"(?i)\\(?P<eq>['\"]).{0,256}?\\(?P=eq)"  # an escaped-quoted value: {\"password\": \"x\"}
    r"|(?P<q>['\"])(?:\\.|(?!(?P=q))[^\\\n]){0,256}(?P=q)"  # a quoted value with spaces, escapes allowed
    r"|(?P<open>['\"]?)(?:(?:bearer|basic|digest|token)\s+)?[^\s'\"]+"  # a bare value, or a long quoted one
)
#: Every secret word contains one of these (lower case): a text with none of them has no secret key.
_KEY_HINTS: Final = ("pass", "pw", "sig", "secret", "token", "key", "auth", "credential", "session")
#: whether a text holds any of `_KEY_HINTS`: one search instead of a test per hint
_ANY_KEY_HINT: Final = re.compile("|".join(map(re.escape, _KEY_HINTS)))
_SECRET_KEY: Final = re.compile(  # a key's last segments
    rf"(?i)(?:{_SECRET_WORDS}|(?:^|(?<=[_.-]))(?:{_SHORT_SECRET_WORDS}))s?(?:[_.-][\w.-]*)?"
)
#: A command-line flag naming a secret, then its value after a space: `--password hunter2`.
_FLAG: Final = re.compile(r"(?<![\w.-])(?P<key>--?[A-Za-z][\w.-]*+)[ \t]+(?=[^\s-])")
_COOKIE: Final = re.compile(r"(?im)\b((?:set-)?cookie\s*[:=]\s*)[^\r\n]+")  # every cookie on the line
_BEARER: Final = re.compile(r"(?i)\b(bearer\s+)[\w.~+/=-]+")  # a token without its header name
#: `Basic <base64 of user:password>` without its header name (see `_hide_basic` for which words count).
_BASIC: Final = re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]+={0,2})(?![\w+/=])")
_LOOKS_ENCODED: Final = re.compile(r"[0-9+/=]|[a-z][A-Z]")
#: A JSON Web Token on its own: base64url of `{"` twice (header, payload), then the signature, if any.
_JWT: Final = re.compile(r"\beyJ[\w-]+\.eyJ[\w-]+(?:\.[\w-]*)?")
_URL_USERINFO: Final = re.compile(r"://[^/\s\"'<>]*@")  # greedy: a password may contain '@'
_PRIVATE_KEY: Final = re.compile(r"-----BEGIN[A-Z ]*PRIVATE KEY-----(?:.*?-----END[A-Z ]*PRIVATE KEY-----|.*)", re.S)


def _names_a_secret(key: str) -> bool:
    found = _SECRET_KEY.search(key)
    while found is not None and found.end() != len(key):  # `secretary`: the word, but not a segment
        found = _SECRET_KEY.search(key, found.start() + 1)
    return found is not None


def _hide_key_values(text: str, keys: re.Pattern[str] = _KEY) -> str:
    out: list[str] = []
    pos = 0
    while (key := keys.search(text, pos)) is not None:
        value = _VALUE.match(text, key.end()) if _names_a_secret(key.group("key")) else None
        if value is None:  # keep scanning after the separator: `Server=db;pwd=hunter2` holds a second pair
            out.append(text[pos : key.end()])
            pos = key.end()
            continue
        out += (text[pos : key.end()], _hidden(value))
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def _hidden(value: re.Match[str]) -> str:
    if value.group("eq"):
        return f"\\{value.group('eq')}{HIDDEN}\\{value.group('eq')}"
    if value.group("q"):
        return f"{value.group('q')}{HIDDEN}{value.group('q')}"
    return value.group("open") + HIDDEN  # a long quoted value keeps its closing quote, after the match


def _builtin(text: str) -> str:
    # Each pattern runs only when a cheap substring test says it may match: most failure texts name no
    # secret, and this keeps their redaction to about a microsecond (every failure pays it).
    lowered = text.lower()
    if "private key" in lowered:
        text = _PRIVATE_KEY.sub(f"-----BEGIN PRIVATE KEY-----{HIDDEN}", text)
    if "cookie" in lowered:
        text = _COOKIE.sub(rf"\g<1>{HIDDEN}", text)
    if _ANY_KEY_HINT.search(lowered) is not None:
        text = _hide_key_values(text)
        if "-" in text:
            text = _hide_key_values(text, _FLAG)
    if "bearer" in lowered:
        text = _BEARER.sub(rf"\g<1>{HIDDEN}", text)
    if "basic" in lowered:
        text = _BASIC.sub(_hide_basic, text)
    if "eyJ" in text:
        text = _JWT.sub(HIDDEN, text)
    return _URL_USERINFO.sub(f"://{HIDDEN}@", text) if "@" in text else text


def _hide_basic(m: re.Match[str]) -> str:
    # Base64 comes in groups of four and a credential's encoding mixes cases or has digits or padding:
    # `Basic dXNlcjpwYXNz` is hidden, `basic validation failed` and `Basic Auth` are not.
    encoded = m.group(2)
    if len(encoded) % 4 or not _LOOKS_ENCODED.search(encoded):
        return m.group(0)
    return m.group(1) + HIDDEN


def _hide_match(m: re.Match[str]) -> str:
    if "secret" not in m.re.groupindex or m.group("secret") is None:
        return HIDDEN
    start, end = m.span("secret")
    whole = m.group(0)
    return whole[: start - m.start()] + HIDDEN + whole[end - m.start() :]


@dataclass(frozen=True, slots=True)
class Redactor:
    """The built-in patterns, then ``extra`` ones in order. Callable: ``Redactor()(text) -> text``.

    Build one with :meth:`with_patterns`, which compiles and checks the patterns (a pattern that matches
    the empty string would hide nothing useful and insert ``[hidden]`` everywhere, so it is refused).
    """

    extra: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def with_patterns(cls, patterns: Sequence[str | re.Pattern[str]]) -> Redactor:
        if isinstance(patterns, str | bytes) or not isinstance(patterns, Sequence):
            raise ConfigError("redact_patterns", patterns, "expected a list of regular expressions")
        return cls(tuple(_compile(p) for p in patterns))

    def __call__(self, text: str) -> str:
        text = _builtin(text)
        for pattern in self.extra:
            text = pattern.sub(_hide_match, text)
        return text


def _compile(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    try:
        compiled = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise ConfigError("redact_patterns", pattern, f"not a regular expression: {exc}") from exc
    if not isinstance(compiled.pattern, str):
        raise ConfigError("redact_patterns", pattern, "expected a text (str) pattern, not bytes")
    if compiled.fullmatch(""):
        raise ConfigError("redact_patterns", pattern, "matches the empty string")
    return compiled


_DEFAULT: Final = Redactor()


def redact(text: str) -> str:
    """``text`` with the built-in patterns applied (see the module docstring)::

    redact("login failed: password=hunter2 at https://bob:pw@db")
    # 'login failed: password=[hidden] at https://[hidden]@db'
    """
    return _DEFAULT(text)


#: Header names that carry a credential without a secret word in them.
_SECRET_HEADERS: Final = frozenset({"cookie", "set-cookie", "proxy-authorization"})


def redact_header(name: str, text: str) -> str:
    """A header's value as shown: [hidden] whole when the header's name names a secret (`authorization`,
    `x-api-key`, `password`, `cookie`), whatever the value looks like; else ``redact(text)``::

    redact_header("x-api-key", "sk-live-4f9a2c")   # '[hidden]'
    """
    if name.lower() in _SECRET_HEADERS or _names_a_secret(name):
        return HIDDEN
    return redact(text)
