"""Secrets in exception text never reach tier or DLQ headers; ordinary diagnostics stay readable.

The table is the catalogue; each row names the secret that must disappear. User patterns extend the built-in ones (`RetryApp(redact_patterns=[...])`).
"""

from __future__ import annotations

import random
import re
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from retrytopics import KafkaConfig, RetryApp, RetryPolicy
from retrytopics.core.errors import ConfigError
from retrytopics.core.headers import redact
from retrytopics.core.redaction import HIDDEN, Redactor
from retrytopics.core.traces import format_trace
from retrytopics.testing import make_record, route_for

# (text, the secret that must not survive)
LEAKS = [
    ("auth failed password=hunter2", "hunter2"),
    ("api_key: abc123", "abc123"),
    ("Authorization: Bearer x.y.z", "x.y.z"),
    ("connect https://bob:pw@db/x", "bob:pw"),
    ("token=tok-1", "tok-1"),
    ('config {"password": "hunter2 with spaces"}', "hunter2 with spaces"),
    ("config {'password': 'hunter2'}", "hunter2"),
    ('payload {\\"password\\": \\"hunter2\\"}', "hunter2"),
    ("POST /oauth access_token=at-777&x=1", "at-777"),
    ("refresh_token=rt-888", "rt-888"),
    ("client_secret=cs-999", "cs-999"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG", "wJalrXUtnFEMI/K7MDENG"),
    ("AWS_SECRET_ACCESS_KEY: wJalrXUtnFEMI", "wJalrXUtnFEMI"),
    ("cannot reach redis://:s3cret@cache:6379/0", "s3cret"),
    ("postgres://bob:p@ss@db.internal/orders", "p@ss"),
    ("postgres://bob:p@ss@db.internal/orders", "ss@db"),  # no half-hidden password either
    ("upstream said 401 for Bearer eyJhbGciOi.eyJzdWIi.sig", "eyJhbGciOi.eyJzdWIi.sig"),
    ("odbc: Server=db;pwd=hunter2;", "hunter2"),
    ("ssl.key.passphrase=correct-horse", "correct-horse"),
    ("sasl.password=pw-1 sasl.username=u", "pw-1"),
    ("x-api-key: k-123", "k-123"),
    ('{"clientSecret": "cs-1", "accessToken": "at-1"}', "cs-1"),
    ('{"clientSecret": "cs-1", "accessToken": "at-1"}', "at-1"),
    ("PGPASSWORD=pg-1 psql", "pg-1"),
    ("request headers: Cookie: sessionid=abc123; csrftoken=def", "abc123"),
    ("request headers: Cookie: sessionid=abc123; theme=dark_secret_pref", "dark_secret_pref"),
    ("Set-Cookie: session_id=zz9; Path=/", "zz9"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\nkqhkiG9w0B\n-----END PRIVATE KEY-----", "MIIEvQIBADANBg"),
    ("-----BEGIN RSA PRIVATE KEY-----\\nMIIEpAIBAAKCAQ\\n-----END RSA PRIVATE KEY-----", "MIIEpAIBAAKCAQ"),
    ("key file cut short: -----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIO", "MHcCAQEEIO"),
    ("credentials=user:pass", "user:pass"),
    ("x" * 300 + "_password=hunter2", "hunter2"),
    ('{"token": "' + "e" * 2000 + '"}', "e" * 100),
    # more forms of the same secrets
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFy==;EndpointSuffix=x", "Zm9vYmFy=="),
    ("kafka-configs --password hunter2 --user bob", "hunter2"),
    ("pass=hunter2", "hunter2"),
    ("db.pw=hunter2", "hunter2"),
    ("POST /login body user=bob&password%3Dhunter2%26x", "hunter2"),
    ("GET https://acct.blob/c?sv=2020-08-04&sig=AbC%2Fdef%3D&se=2026", "AbC%2Fdef"),
    ("rejected eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc_DEF-123", "eyJzdWIiOiIxIn0"),
    ("upstream got Basic dXNlcjpwYXNzd29yZA== and said 401", "dXNlcjpwYXNzd29yZA=="),
    ('{:password => "hunter2", :user => "bob"}', "hunter2"),
    ('{"password" => "hunter2"}', "hunter2"),
]

# Text that carries no secret and must come out unchanged.
KEPT = [
    "password reset failed for user bob",
    "order_id=42 amount_cents=700 currency=EUR",
    "the tokenizer failed at line 3",
    "KeyError: 'order-id'",
    "keyboard=us primary_key=7 monkey=1 secretary=alice",
    "GET https://example.com/orders/@latest returned 500",
    "timeout after 5s on orders.billing.retry.5s[0]@17",
    "ValueError: invalid literal for int() with base 10: 'x'",
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
    "basic validation failed: Basic Auth required",
    "compass=north bypass=1 design=flat signal=9 passes=3",
    "retry with --verbose --max-retries 3 - see the log",
    "pw reset requested; sig handler installed",
]


@pytest.mark.parametrize(("text", "secret"), LEAKS)
def test_every_common_secret_form_is_hidden(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out, out
    assert HIDDEN in out


@pytest.mark.parametrize("text", KEPT)
def test_ordinary_diagnostics_are_left_alone(text: str) -> None:
    assert redact(text) == text


def test_hidden_values_keep_their_quotes_and_keys() -> None:
    assert redact('{"password": "x", "user": "bob"}') == '{"password": "[hidden]", "user": "bob"}'
    assert redact("Authorization: Bearer abc") == "Authorization: [hidden]"
    assert redact("redis://:pw@cache:6379") == "redis://[hidden]@cache:6379"


def test_user_patterns_add_to_the_built_in_ones() -> None:
    # setup: one pattern hides its whole match, the other only its `secret` group
    redactor = Redactor.with_patterns([r"\bAKIA[0-9A-Z]{16}\b", re.compile(r"ssn=(?P<secret>\d{3}-\d{2}-\d{4})")])
    # when
    out = redactor("key AKIAIOSFODNN7EXAMPLE ssn=123-45-6789 password=pw")
    # then
    assert out == "key [hidden] ssn=[hidden] password=[hidden]"


@pytest.mark.parametrize("bad", ["(", "x*", b"raw", "just-a-string", 42])
def test_bad_user_patterns_are_config_errors(bad: object) -> None:
    patterns = bad if bad == "just-a-string" else [bad]
    with pytest.raises(ConfigError) as info:
        Redactor.with_patterns(patterns)  # type: ignore[arg-type]
    assert info.value.field == "redact_patterns"


def test_traces_are_redacted_by_the_redactor_they_are_given() -> None:
    # the stack text is cached per failure site: a second redactor must not get the first one's text
    def fail() -> BaseException:
        try:
            raise RuntimeError("customer 4111-1111-1111-1111 refused")
        except RuntimeError as exc:
            return exc

    card = Redactor.with_patterns([r"\b(?:\d{4}-){3}\d{4}\b"])
    assert "4111" in format_trace(fail(), redact=redact)
    assert "4111" not in format_trace(fail(), redact=card)


def test_redaction_is_total_and_fast_on_hostile_text() -> None:
    rng = random.Random(16)
    alphabet = "password=:\"'\\@/ -_.tokenBearer\n"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(300)))
        assert isinstance(redact(text), str)
    # unclosed quotes and long runs must stay linear-ish (a regex that backtracks would hang here)
    redact('password="' + "a" * 200_000)
    redact("x" * 200_000 + "://" + "a" * 200_000)


def test_long_runs_of_key_like_text_stay_fast() -> None:
    # matched with backtracking, `token_token_...` was quadratic (48 kB took 46 s), and so was `a=a=a=...`
    # when every value was matched before its key was known to be a secret (80 kB took 36 s)
    # this thread's CPU time, not the clock: a loaded machine stretches the wall time, not the work done
    started = time.thread_time()
    for text in ("token_" * 8000, "a=" * 40000, "x:" * 40000, "password='" * 20000, "secretary" * 20000 + "=x"):
        redact(text)
    assert time.thread_time() - started < 2.0


def _route_twice(app: RetryApp, message: str) -> list[str]:
    """The exception headers of the first hop (source → tier 0) and of the second (tier 0 → tier 1)."""
    first = route_for(app, make_record(b"v", topic="orders"), RuntimeError(message))
    second = route_for(app, make_record(b"v", topic="orders", attempt=2, group="billing"), RuntimeError(message))
    assert second.retry.reconsume_times == 2
    return [f"{r.retry.exception_message}\n{r.retry.exception_trace}" for r in (first, second)]


def test_retry_app_redacts_exception_headers_with_its_own_patterns() -> None:
    # setup: an app with one user pattern on top of the built-in ones
    app = RetryApp(
        kafka=KafkaConfig(bootstrap="127.0.0.1:9092"), group="billing", redact_patterns=[r"\bAKIA[0-9A-Z]{16}\b"]
    )
    app.handler("orders", policy=RetryPolicy(delays=["1s", "2s"]))(lambda record: None)
    # when: the failure's text carries a built-in form and the user's
    headers = _route_twice(app, "upstream refused access_token=at-1 for key AKIAIOSFODNN7EXAMPLE")
    # then: both hops hide both, in the message and in the trace's exception line
    for text in headers:
        assert "at-1" not in text and "AKIAIOSFODNN7EXAMPLE" not in text
        assert text.count(HIDDEN) == 4


def test_retry_app_refuses_a_bad_pattern() -> None:
    with pytest.raises(ConfigError) as info:
        RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:9092"), group="billing", redact_patterns=["("])
    assert info.value.field == "redact_patterns"


# Secret forms of item 12, each with `{}` where the secret goes.
_FORMS = [
    "AccountKey={}",
    "SharedAccessKey={};",
    "--password {}",
    "-pw {}",
    "pass={}",
    "pw={}",
    "password%3D{}",
    "sig={}&se=1",
    ':password => "{}"',
    "'pass' => '{}'",
]
_SECRET_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/=_.~%-!#"
_PLAIN_WORDS = [
    "order",
    "42",
    "failed",
    "timeout",
    "compass",
    "basic",
    "design",
    "bypass",
    "passes",
    "user=bob",
    "-",
    "--verbose",
    "at",
    "offset=7",
    "Auth",
    "=>",
    "signal",
    "keyboard",
    "Basic",
]


@given(
    form=st.sampled_from(_FORMS),
    secret=st.text(_SECRET_CHARS, min_size=6, max_size=40).filter(lambda s: s[0] != "-" and s not in HIDDEN),
    before=st.lists(st.sampled_from(_PLAIN_WORDS), max_size=4),
    after=st.lists(st.sampled_from(_PLAIN_WORDS), max_size=4),
)
@settings(max_examples=300, deadline=None)
def test_secret_forms_are_hidden_whatever_the_secret_and_its_neighbours(
    form: str, secret: str, before: list[str], after: list[str]
) -> None:
    """Whatever the secret's characters and the ordinary words around it, none of it survives."""
    assume(secret not in " ".join([*before, form, *after]))  # else it is there as ordinary text
    text = " ".join([*before, form.format(secret), *after])
    assert secret not in redact(text)


@given(words=st.lists(st.sampled_from(_PLAIN_WORDS), max_size=12))
@settings(max_examples=300, deadline=None)
def test_ordinary_words_are_never_redacted(words: list[str]) -> None:
    """Words that only look like secret names (`compass`, `bypass`, `Basic Auth`, flags without a secret
    name) come out unchanged."""
    text = " ".join(words)
    assert redact(text) == text
