"""`--where` of the replay job: a filter over the typed columns, parsed here and rebuilt as Spark SQL.

Only column references, literals, comparison, boolean and arithmetic operators, `IS [NOT] NULL`,
`[NOT] IN (...)`, `[NOT] BETWEEN ... AND ...`, `[NOT] LIKE '...'` and a short list of pure functions are
accepted::

    to_sql("original_partition = 3 AND lower(exception_type) LIKE '%timeout%'")
    # "((`original_partition` = 3) AND (lower(`exception_type`) LIKE '%timeout%'))"

Anything else (`reflect`, `java_method`, `raise_error`, `CAST`, subqueries, an unknown column) raises
:class:`~retrytopics.errors.ConfigError` before Spark sees it: Spark SQL can call JVM methods and read files,
and its error messages would echo what they read. The SQL handed to Spark is rebuilt from the parse tree,
never the user's text, so nothing unparsed can slip through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from retrytopics.core.errors import ConfigError

__all__ = ["ALLOWED_COLUMNS", "FUNCTIONS", "MAX_DEPTH", "MAX_LENGTH", "to_sql"]

#: Columns a filter may name: the typed retry columns and the DLQ record's own Kafka coordinates.
ALLOWED_COLUMNS: Final = frozenset(
    {
        "schema_version",
        "reconsume_times",
        "origin_message_id",
        "original_topic",
        "original_partition",
        "original_offset",
        "original_timestamp",
        "consumer_group",
        "tier",
        "due_at",
        "first_failed_at",
        "last_failed_at",
        "exception_type",
        "exception_message",
        "exception_trace",
        "dlq_reason",
        "replay_id",
        "replayed_at",
        "replay_count",
        "replay_origin_id",
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
    }
)
#: Pure functions a filter may call → (fewest, most) arguments.
FUNCTIONS: Final[dict[str, tuple[int, int]]] = {
    "lower": (1, 1),
    "upper": (1, 1),
    "trim": (1, 1),
    "length": (1, 1),
    "abs": (1, 1),
    "coalesce": (1, 8),
    "startswith": (2, 2),
    "endswith": (2, 2),
    "contains": (2, 2),
    "unix_millis": (1, 1),
    "timestamp_millis": (1, 1),
}
MAX_LENGTH: Final = 4096
MAX_DEPTH: Final = 40
_KEYWORDS: Final = frozenset({"and", "or", "not", "in", "is", "null", "true", "false", "between", "like"})
_TOKEN: Final = re.compile(
    r"""\s*(?:
      (?P<number>\d{1,38}(?:\.\d{1,38})?)(?![\w.])
    | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*|`[A-Za-z_][A-Za-z0-9_]*`)
    | (?P<op><=>|<=|>=|<>|!=|==|[=<>+\-*/%(),])
    )""",
    re.VERBOSE | re.DOTALL,
)
_COMPARISONS: Final = {
    "=": "=",
    "==": "=",
    "<=>": "<=>",
    "!=": "!=",
    "<>": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number, string, name, keyword, op, end
    text: str  # the normalised text: a string's Spark body (see _spark_body), a lower-cased name or keyword


def _spark_body(literal: str) -> str:
    """The body of a quoted literal as Spark reads it between single quotes: backslash escapes kept as
    written (Spark decodes them: `\\n`, `\\u00e9`), a doubled quote as one, a single quote as `\\'`. The
    body always ends on a whole escape, so the rebuilt literal cannot end early."""
    quote, body = literal[0], literal[1:-1]
    parts = re.findall(r"\\.|" + quote * 2 + r"|.", body, flags=re.DOTALL)
    quoted = {quote * 2: "\\'" if quote == "'" else '"', "'": "\\'"}
    return "".join(quoted.get(part, part) for part in parts)


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    position = 0
    while text[position:].strip():
        match = _TOKEN.match(text, position)
        if match is None:
            raise ConfigError("where", text[position : position + 40], "not allowed here: " + _RULE)
        kind = match.lastgroup or ""
        raw = match.group(kind)
        if kind == "string":
            out.append(_Token("string", _spark_body(raw)))
        elif kind == "name":
            word = raw.strip("`").lower()
            out.append(_Token("keyword" if word in _KEYWORDS and not raw.startswith("`") else "name", word))
        else:
            out.append(_Token(kind, raw))
        position = match.end()
    return [*out, _Token("end", "")]


_RULE = (
    "a --where filter may use the typed columns, literals, comparisons, AND/OR/NOT, + - * / %, IS NULL, IN, "
    "BETWEEN, LIKE and the functions " + ", ".join(sorted(FUNCTIONS))
)


def _quote(body: str) -> str:
    return f"'{body}'"


class _Parser:
    """Recursive descent over the tokens; each method returns the rebuilt SQL of what it read."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens, self.at, self.depth = tokens, 0, 0

    def peek(self, *texts: str) -> bool:
        token = self.tokens[self.at]
        return token.kind in ("keyword", "op") and token.text in texts

    def take(self, *texts: str) -> str:
        token = self.tokens[self.at]
        if not self.peek(*texts):
            shown = token.text if token.kind != "end" else "the end"
            raise ConfigError("where", shown, f"expected {' or '.join(texts)}; " + _RULE)
        self.at += 1
        return token.text

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ConfigError("where", self.depth, f"nested deeper than {MAX_DEPTH}")

    def parse(self) -> str:
        sql = self.disjunction()
        if self.tokens[self.at].kind != "end":
            raise ConfigError("where", self.tokens[self.at].text, "unexpected text after the filter; " + _RULE)
        return sql

    def disjunction(self) -> str:
        sql = self.conjunction()
        while self.peek("or"):
            self.take("or")
            sql = f"({sql} OR {self.conjunction()})"
        return sql

    def conjunction(self) -> str:
        sql = self.negation()
        while self.peek("and"):
            self.take("and")
            sql = f"({sql} AND {self.negation()})"
        return sql

    def negation(self) -> str:
        if self.peek("not"):
            self.take("not")
            self.nested()
            sql = f"(NOT {self.negation()})"
            self.depth -= 1
            return sql
        return self.predicate()

    def predicate(self) -> str:
        left = self.additive()
        if self.tokens[self.at].text in _COMPARISONS and self.tokens[self.at].kind == "op":
            op = _COMPARISONS[self.take(*_COMPARISONS)]
            return f"({left} {op} {self.additive()})"
        if self.peek("is"):
            self.take("is")
            negated = " NOT" if self.peek("not") and self.take("not") else ""
            self.take("null")
            return f"({left} IS{negated} NULL)"
        negated = "NOT " if self.peek("not") and self.take("not") else ""
        if negated and not self.peek("in", "between", "like"):
            self.take("in", "between", "like")
        if self.peek("in"):
            self.take("in")
            return f"({left} {negated}IN ({', '.join(self.arguments())}))"
        if self.peek("between"):
            self.take("between")
            low = self.additive()
            self.take("and")
            return f"({left} {negated}BETWEEN {low} AND {self.additive()})"
        if self.peek("like"):
            self.take("like")
            token = self.tokens[self.at]
            if token.kind != "string":
                raise ConfigError("where", token.text, "LIKE takes a string literal pattern")
            self.at += 1
            return f"({left} {negated}LIKE {_quote(token.text)})"
        return left

    def additive(self) -> str:
        sql = self.multiplicative()
        while self.peek("+", "-"):
            sql = f"({sql} {self.take('+', '-')} {self.multiplicative()})"
        return sql

    def multiplicative(self) -> str:
        sql = self.unary()
        while self.peek("*", "/", "%"):
            sql = f"({sql} {self.take('*', '/', '%')} {self.unary()})"
        return sql

    def unary(self) -> str:
        if self.peek("-"):
            self.take("-")
            self.nested()
            sql = f"(- {self.unary()})"
            self.depth -= 1
            return sql
        return self.primary()

    def primary(self) -> str:
        token = self.tokens[self.at]
        if token.kind == "number":
            self.at += 1
            return token.text
        if token.kind == "string":
            self.at += 1
            return _quote(token.text)
        if token.kind == "keyword" and token.text in ("null", "true", "false"):
            self.at += 1
            return token.text.upper()
        if self.peek("("):
            self.take("(")
            self.nested()
            sql = self.disjunction()
            self.take(")")
            self.depth -= 1
            return sql
        if token.kind == "name":
            self.at += 1
            return self.call(token.text) if self.peek("(") else self.column(token.text)
        shown = token.text if token.kind != "end" else "the end"
        raise ConfigError("where", shown, "expected a column, a literal or a function call; " + _RULE)

    def column(self, name: str) -> str:
        if name not in ALLOWED_COLUMNS:
            raise ConfigError("where", name, f"unknown column; allowed: {', '.join(sorted(ALLOWED_COLUMNS))}")
        return f"`{name}`"

    def call(self, name: str) -> str:
        if name not in FUNCTIONS:
            raise ConfigError("where", name, "function not allowed; " + _RULE)
        arguments = self.arguments()
        fewest, most = FUNCTIONS[name]
        if not fewest <= len(arguments) <= most:
            raise ConfigError("where", name, f"takes {fewest}..{most} arguments, got {len(arguments)}")
        return f"{name}({', '.join(arguments)})"

    def arguments(self) -> list[str]:
        self.take("(")
        self.nested()
        arguments = [self.disjunction()]
        while self.peek(","):
            self.take(",")
            arguments.append(self.disjunction())
        self.take(")")
        self.depth -= 1
        return arguments


def to_sql(text: str) -> str:
    """The filter `text` rebuilt as Spark SQL from its parse tree; raises ConfigError (naming what was refused)
    for anything outside the grammar in the module docstring."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("where", text, "expected a non-empty filter")
    if len(text) > MAX_LENGTH:
        raise ConfigError("where", len(text), f"longer than {MAX_LENGTH} characters")
    return _Parser(_tokens(text)).parse()
