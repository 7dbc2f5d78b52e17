"""The replay's `--where` filter: only column references, literals, operators and a few pure functions reach
Spark, rebuilt from the parse tree (`reflect`/`java_method` ran and `raise_error`/casts leaked a
local file's contents)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.errors import ConfigError
from retrytopics.spark.where import ALLOWED_COLUMNS, FUNCTIONS, MAX_DEPTH, MAX_LENGTH, to_sql


@pytest.mark.parametrize(
    ("text", "sql"),
    [
        (
            "original_partition = 3 AND reconsume_times >= 2",
            "((`original_partition` = 3) AND (`reconsume_times` >= 2))",
        ),
        (
            "dlq_reason = 'exhausted' or NOT replay_count > 0",
            "((`dlq_reason` = 'exhausted') OR (NOT (`replay_count` > 0)))",
        ),
        ("lower(exception_type) LIKE '%time''out%'", "(lower(`exception_type`) LIKE '%time\\'out%')"),
        ('exception_message = "it\'s"', "(`exception_message` = 'it\\'s')"),
        ('exception_message = "say ""hi"""', "(`exception_message` = 'say \"hi\"')"),
        ("exception_message = 'a\\nb\\\\'", "(`exception_message` = 'a\\nb\\\\')"),  # Spark's escapes kept
        (
            "original_offset NOT IN (1, 2) AND tier IS NOT NULL",
            "((`original_offset` NOT IN (1, 2)) AND (`tier` IS NOT NULL))",
        ),
        ("`partition` between 0 and -1", "(`partition` BETWEEN 0 AND (- 1))"),
        (
            "unix_millis(timestamp) - unix_millis(first_failed_at) < 60000 * 5",
            "((unix_millis(`timestamp`) - unix_millis(`first_failed_at`)) < (60000 * 5))",
        ),
        ("coalesce(replay_count, 0) <> 1", "(coalesce(`replay_count`, 0) != 1)"),
        ("startswith(origin_message_id, 'orders-') = true", "(startswith(`origin_message_id`, 'orders-') = TRUE)"),
    ],
)
def test_allowed_filters_are_rebuilt_from_the_parse_tree(text: str, sql: str) -> None:
    assert to_sql(text) == sql


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("reflect('java.lang.System', 'getProperty', 'user.home') IS NOT NULL", "reflect"),
        ("java_method('java.lang.Runtime', 'getRuntime') IS NULL", "java_method"),
        ("raise_error(original_topic) IS NULL", "raise_error"),
        ("cast(value AS int) = 1", "cast"),
        ("CAST(exception_message AS INT) = 1", "cast"),
        ("length(read_file('/etc/passwd')) > 0", "read_file"),
        ("original_offset = 1; DROP TABLE x", ";"),
        ("original_offset IN (SELECT 1)", "select"),
        ("exception_type RLIKE '(a+)+$'", "rlike"),
        ("secret_column = 1", "secret_column"),
        ("`reflect`('a', 'b') = 1", "reflect"),
        ("original_offset = 1 --", "the end"),
        ("original_offset = 1 /* c */", "*"),
        ("exception_type LIKE exception_message", "exception_message"),
        ("lower(exception_type, 'x') = 'y'", "lower"),
        ("original_offset = 1)", ")"),
        ("original_offset = ", "the end"),
        ("transform(headers, h -> h.key) IS NULL", ".key"),  # refused as text before any name is looked up
        ("original_offset = 1e400", "1e400"),
        ("x'00' = value", "x"),
    ],
)
def test_anything_else_is_refused_and_named(text: str, refused: str) -> None:
    with pytest.raises(ConfigError) as raised:
        to_sql(text)
    assert raised.value.field == "where"
    assert refused.lower() in str(raised.value.value).lower()


def test_size_and_depth_are_bounded() -> None:
    with pytest.raises(ConfigError, match="longer than"):
        to_sql("original_offset = 1 OR " * (MAX_LENGTH // 20) + "tier = 1")
    with pytest.raises(ConfigError, match="nested deeper"):
        to_sql("(" * (MAX_DEPTH + 1) + "tier = 1" + ")" * (MAX_DEPTH + 1))
    assert to_sql("(" * MAX_DEPTH + "tier = 1" + ")" * MAX_DEPTH) == "(`tier` = 1)"
    assert to_sql(" AND ".join(["NOT tier = 1"] * (MAX_DEPTH + 5))).count("NOT") == MAX_DEPTH + 5


_columns = st.sampled_from(sorted(ALLOWED_COLUMNS))
_literals = st.one_of(
    st.integers(0, 10**12).map(str),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8).map(
        lambda s: "'" + s.replace("\\", "\\\\").replace("'", "''") + "'"
    ),
    st.sampled_from(["NULL", "true", "FALSE"]),
)


def _calls(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    def build(name: str, args: list[str]) -> str:
        return f"{name}({', '.join(args)})"

    return st.sampled_from(sorted(FUNCTIONS)).flatmap(
        lambda name: st.lists(inner, min_size=FUNCTIONS[name][0], max_size=FUNCTIONS[name][1]).map(
            lambda args: build(name, args)
        )
    )


_values = st.recursive(
    st.one_of(_columns, _literals),
    lambda inner: st.one_of(
        _calls(inner),
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(" ".join),
        inner.map(lambda v: f"-{v}"),
    ),
    max_leaves=6,
)
_predicates = st.one_of(
    st.tuples(_values, st.sampled_from(["=", "!=", "<>", "<", "<=", ">", ">=", "<=>"]), _values).map(" ".join),
    _values.map(lambda v: f"{v} IS NOT NULL"),
    st.tuples(_values, st.lists(_literals, min_size=1, max_size=3)).map(lambda t: f"{t[0]} NOT IN ({', '.join(t[1])})"),
    st.tuples(_values, _values, _values).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
    _values.map(lambda v: f"{v} LIKE 'a%'"),
)
_filters = st.recursive(
    _predicates,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["AND", "or"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        inner.map(lambda f: f"NOT ({f})"),
    ),
    max_leaves=5,
)


@given(_filters)
def test_every_filter_of_the_grammar_is_accepted_and_its_sql_is_a_fixed_point(text: str) -> None:
    sql = to_sql(text)
    assert to_sql(sql) == sql


@given(st.text(max_size=200))
def test_any_text_is_accepted_or_refused_with_a_config_error(text: str) -> None:
    try:
        to_sql(text)
    except ConfigError:
        pass


@given(st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True), st.sampled_from(["1", "original_topic", "'x'"]))
def test_a_function_outside_the_list_is_refused(name: str, argument: str) -> None:
    text = f"{name}({argument}) IS NULL"
    if name in FUNCTIONS:
        assert to_sql(text).startswith(f"({name}(")
    else:
        with pytest.raises(ConfigError):
            to_sql(text)
