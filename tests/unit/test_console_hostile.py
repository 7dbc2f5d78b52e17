"""The console's web layer under hostile records and hostile requests, without a broker or a browser (a fake
reader, raw ASGI calls): every malformed DLQ record renders and can be selected; a request body is refused by
size and type before it is read, and not read at all where the request cannot act; reveal, logout and job
pages need a session on an actions console; the rebinding guard covers every loopback address; bad cursors are
400s; every response, errors and 500s included, carries the security headers; wrong tokens are rate limited;
a replay id typed into the form is checked; a record another console replay listed is not replayed again;
DLQ pages are read two at a time."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from typing import Any

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from retrytopics.console import actions, views
from retrytopics.console.entries import Entry, entry_of
from retrytopics.console.sessions import Sessions
from retrytopics.console.web import CONTENT_SECURITY_POLICY, MAX_BODY_BYTES, ConsoleOptions, create_app, is_loopback
from retrytopics.core.headers import (
    CONSUMER_GROUP,
    DLQ_REASON,
    EXCEPTION_MESSAGE,
    REPLAY_COUNT,
    TIER,
    encode,
)

from .test_console_web import TOKEN, TOPICS, FakeReader, dlq_entry, state

SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


def _hostile(offset: int, headers: list[tuple[str, bytes | None]], **kw: Any) -> Entry:
    fields: dict[str, Any] = {"key": b"<img src=x onerror=alert(1)>", "value": b"v"} | kw
    return entry_of(topic=TOPICS.dlq, partition=0, offset=offset, timestamp_ms=5000 - offset, headers=headers, **fields)


def hostile_entries() -> list[Entry]:
    """The issue's records: retry headers missing, one field missing, a tier and a reason together, more than
    1,024 and 10,000 headers, a duplicated replay count, a non-UTF-8 key and header, unreadable header keys."""
    full = encode(state())
    return [
        _hostile(0, [(EXCEPTION_MESSAGE, b"boom"), (DLQ_REASON, b"exhausted")]),
        _hostile(1, [(k, v) for k, v in full if k != CONSUMER_GROUP]),
        _hostile(2, [*full, (TIER, b"0")]),
        _hostile(3, [*full, *((f"x-{i}", b"y") for i in range(1100))]),
        _hostile(4, [*full, (REPLAY_COUNT, b"1"), (REPLAY_COUNT, b"2")]),
        _hostile(5, [("x-bin", b"\xff\xfe"), *full], key=b"\xff\xfe\x00"),
        _hostile(6, [*full, *((f"x-{i}", b"z" * 100) for i in range(10_000))]),
        _hostile(7, [*full], unreadable="header key 3 is not UTF-8"),
        dlq_entry(8),
    ]


def logged_in(app: TestClient, operator: str = "ada") -> str:
    response = app.post("/login", data={"operator": operator, "token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303
    found = re.search(r'name="csrf" value="([^"]+)"', app.get("/dlq").text)
    assert found is not None
    return found.group(1)


def client(entries: list[Entry], *, actions_on: bool = True, host: str = "127.0.0.1", reader: Any = None) -> TestClient:
    options = ConsoleOptions(actions=actions_on, token=TOKEN if actions_on else None, host=host)
    app = create_app(options, reader or FakeReader(entries))
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


def test_every_hostile_record_renders_and_can_be_selected() -> None:
    entries = hostile_entries()
    app = client(entries)
    logged_in(app)
    response = app.get("/dlq")
    assert response.status_code == 200
    picks = set(re.findall(r'name="records" value="([^"]+)" class="pick"', response.text))
    assert picks == {e.coordinates for e in entries}
    assert "<img src=x" not in response.text and "&lt;img src=x onerror=alert(1)&gt;" in response.text
    cut = [int(n) for n in re.findall(r'class="headers-not-shown">(\d+) more not shown', response.text)]
    assert max(cut) > 9_800  # the 10,000-header record: a few shown, the rest counted


def test_a_record_whose_view_fails_shows_as_unreadable_and_can_still_be_selected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = views.record_view

    def failing(entry: Entry, **kw: Any) -> views.RecordView:
        if entry.offset == 1:
            raise ValueError("no view of <this>")
        return shown(entry, **kw)

    monkeypatch.setattr(views, "record_view", failing)
    app = client([dlq_entry(0), dlq_entry(1)])
    logged_in(app)
    page = app.get("/dlq")
    assert page.status_code == 200
    assert 'value="0:1" class="pick"' in page.text and "ValueError: no view of &lt;this&gt;" in page.text


class _Call:
    """One raw ASGI request; counts how often the app asked for the body."""

    def __init__(self, app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b""):
        self.reads = 0
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            self.reads += 1
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        path_only, _, query = path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path_only,
            "raw_path": path_only.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1:8765"), *headers],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8765),
        }
        asyncio.run(app(scope, receive, send))
        start = next(m for m in sent if m["type"] == "http.response.start")
        self.status = start["status"]
        self.headers = {k.decode(): v.decode() for k, v in start["headers"]}


FORM = (b"content-type", b"application/x-www-form-urlencoded")


@pytest.mark.parametrize("actions_on", [False, True])
def test_a_body_is_refused_before_it_is_read_where_it_is_too_large_or_not_a_form(actions_on: bool) -> None:
    app = client([dlq_entry()], actions_on=actions_on).app
    huge = _Call(app, "POST", "/logout", [FORM, (b"content-length", b"314572800")])
    assert (huge.status, huge.reads) == (413, 0)
    multipart = [(b"content-type", b"multipart/form-data; boundary=x"), (b"content-length", b"100")]
    assert (_Call(app, "POST", "/actions/replay", multipart).status, 0) == (415, 0)
    assert _Call(app, "POST", "/login", [FORM]).status == 411  # no length given: nothing is read
    assert huge.headers["content-security-policy"] == CONTENT_SECURITY_POLICY


@pytest.mark.parametrize("path", ["/logout", "/actions/replay", "/actions/spark-replay"])
@pytest.mark.parametrize("actions_on", [False, True])
def test_a_request_that_cannot_act_is_refused_without_reading_its_body(path: str, actions_on: bool) -> None:
    """Read-only, or no session: the body (within the size limit) is never read."""
    app = client([dlq_entry()], actions_on=actions_on).app
    body = b"csrf=x&records=0:0&step=run"
    call = _Call(app, "POST", path, [FORM, (b"content-length", str(len(body)).encode())], body)
    assert (call.status, call.reads) == (403, 0)


def test_the_body_limit_lets_a_full_selection_through() -> None:
    form = "&".join(f"records=0%3A{10**12 + i}" for i in range(actions.MAX_SELECTION)) + "&csrf=" + "x" * 64
    assert len(form) < MAX_BODY_BYTES


def test_reveal_needs_a_session_on_an_actions_console_and_is_logged_with_who(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = client([dlq_entry()])
    caplog.set_level(logging.INFO, "retrytopics.console.actions")
    refused = app.get("/dlq?reveal=0:0")
    assert refused.status_code == 403 and 'class="value"' not in refused.text
    assert "reveal" not in caplog.text
    logged_in(app, "grace")
    assert '<pre class="value">' in app.get("/dlq?reveal=0:0").text
    assert '"action": "reveal"' in caplog.text and '"who": "grace"' in caplog.text


def test_the_read_only_console_reveals_without_a_session() -> None:
    assert '<pre class="value">' in client([dlq_entry()], actions_on=False).get("/dlq?reveal=0:0").text


@pytest.mark.parametrize("host", ["127.0.0.2", "127.1.2.3", "::1", "localhost"])
def test_every_loopback_bind_refuses_a_foreign_host_header(host: str) -> None:
    app = client([dlq_entry()], actions_on=False, host=host)
    refused = app.get("/", headers={"host": "evil.example"})
    assert refused.status_code == 400 and refused.headers["x-frame-options"] == "DENY"
    assert app.get("/", headers={"host": "127.0.0.2:8765"}).status_code == 200
    assert app.get("/", headers={"host": "[::1]:8765"}).status_code == 200


def test_loopback_names() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.255.0.9", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "::", "evil.example", "127.0.0.1.evil", ""))


@pytest.mark.parametrize("query", ["after=%C2%B2:1", "after=1:%C2%B2", "after=%D9%A3:1"])
def test_a_bad_cursor_is_a_400(query: str) -> None:
    response = client([dlq_entry()], actions_on=False).get("/dlq?" + query)
    assert response.status_code == 400 and "after" in response.text


def test_a_bad_replay_coordinate_or_a_typed_replay_id_is_a_400() -> None:
    app = client([dlq_entry()])
    csrf = logged_in(app)
    bad = app.post("/actions/replay", data={"csrf": csrf, "records": "0:\u00b2"})
    assert bad.status_code == 400 and "records" in bad.text
    typed = app.post("/actions/replay", data={"csrf": csrf, "records": "0:0", "replay_id": "console-0123456789abcdef"})
    assert typed.status_code == 400 and "replay_id" in typed.text


class _BrokenReader(FakeReader):
    def dlq_page(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the reader broke")


@pytest.mark.parametrize(("path", "status"), [("/dlq?after=x", 400), ("/nowhere", 404), ("/dlq", 500)])
def test_every_error_response_carries_the_security_headers(path: str, status: int) -> None:
    app = client([dlq_entry()], reader=_BrokenReader([dlq_entry()]) if status == 500 else None)
    response = app.get(path)
    assert response.status_code == status
    assert {k: response.headers.get(k) for k in SECURITY_HEADERS} == SECURITY_HEADERS
    forbidden = client([dlq_entry()], actions_on=False).post("/login", data={"operator": "x", "token": "y"})
    assert forbidden.status_code == 403 and forbidden.headers["cache-control"] == "no-store"


def test_wrong_tokens_are_rate_limited() -> None:
    now = [0.0]
    sessions = Sessions(TOKEN, clock=lambda: now[0], failures_allowed=3, failure_window_s=60)
    for _ in range(3):
        assert sessions.login("eve", "wrong-token-guess-000") is None
    assert sessions.login_blocked_for() == 60
    now[0] = 61
    assert sessions.login_blocked_for() == 0 and sessions.login("ada", TOKEN) is not None
    app = client([dlq_entry()])
    answers = [app.post("/login", data={"operator": "eve", "token": "w" * 20}).status_code for _ in range(6)]
    assert answers == [403] * 5 + [429]
    blocked = app.post("/login", data={"operator": "ada", "token": TOKEN}, follow_redirects=False)
    assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) > 0


def test_logout_needs_the_csrf_token_and_ends_the_server_session() -> None:
    app = client([dlq_entry()])
    csrf = logged_in(app)
    assert app.post("/logout", data={}).status_code == 403  # a cross-site form: no CSRF token
    assert "actions on · ada" in app.get("/dlq").text  # still logged in
    cookie = app.cookies.get("retrytopics_console")
    assert app.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    app.cookies.set("retrytopics_console", cookie or "")  # the old cookie, replayed: the session is gone
    assert app.post("/actions/replay", data={"csrf": csrf, "records": "0:0"}).status_code == 403


@pytest.mark.parametrize("path", ["/actions/jobs/j-1", "/api/jobs/j-1"])
def test_job_pages_need_a_session_when_actions_are_on(path: str) -> None:
    app = client([dlq_entry()])
    assert app.get(path).status_code == 403
    logged_in(app)
    assert app.get(path).status_code == 404  # no such job, but now asked by an operator


def test_a_record_another_console_replay_listed_is_skipped_whatever_else_is_selected() -> None:
    a, b = dlq_entry(0), dlq_entry(1, retry=state(origin="o-2", original_offset=8))
    selection = ((0, 0), (0, 1))
    request = actions.ReplayRequest(replay_id=actions.replay_id_for("original", selection), coordinates=selection)
    earlier = actions.replay_id_for("original", [(0, 0)])
    listed = {a.source_record or "": earlier}
    plan = actions.plan_replay([a, b], topics=TOPICS, request=request, source_partitions=2, replayed=listed)
    assert [e.coordinates for e, _ in plan.writes] == ["0:1"]
    assert plan.counts["skipped_replayed_before"] == 1 and plan.replayed_before == {"0:0": earlier}
    own = actions.plan_replay(  # its own listing (a rerun) is the ledger's marks' business, not skipped here
        [a, b], topics=TOPICS, request=request, source_partitions=2, replayed={a.source_record or "": request.replay_id}
    )
    assert len(own.writes) == 2


def test_only_a_console_replays_started_entry_lists_records() -> None:
    started = b'{"event": "started", "replay_id": "console-0123456789abcdef", "records": ["orders-0-7", 3]}'
    assert actions._listed(started) == [("orders-0-7", "console-0123456789abcdef")]
    for other in (b"not json", b"[]", b'{"event": "finished", "replay_id": "console-x", "records": ["a"]}', None):
        assert actions._listed(other) == []
    assert actions._listed(b'{"event": "started", "replay_id": "nightly", "records": ["orders-0-7"]}') == []


def test_the_console_keeps_the_action_log_at_info_whatever_the_log_level() -> None:
    from retrytopics.console import keep_action_log
    from retrytopics.operator.logs import configure_logging

    configure_logging("WARNING")
    keep_action_log()
    assert logging.getLogger("retrytopics.console.actions").isEnabledFor(logging.INFO)


class _SlowReader(FakeReader):
    """A DLQ page that waits (up to a second) until three are read at once, and counts how many are."""

    def __init__(self, entries: list[Entry]) -> None:
        super().__init__(entries)
        self.lock = threading.Lock()
        self.active = self.most = 0
        self.three = threading.Event()

    def dlq_page(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            if self.active >= 3:
                self.three.set()
        self.three.wait(1.0)
        with self.lock:
            self.active -= 1
        return super().dlq_page(*args, **kwargs)


def test_page_loads_are_read_two_at_a_time() -> None:
    reader = _SlowReader([dlq_entry()])
    app = client([], actions_on=False, reader=reader).app

    async def four() -> list[int]:
        async def one() -> int:
            sent: list[dict[str, Any]] = []

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "GET",
                "scheme": "http",
                "path": "/dlq",
                "raw_path": b"/dlq",
                "query_string": b"",
                "root_path": "",
                "headers": [(b"host", b"127.0.0.1")],
                "client": ("127.0.0.1", 50000),
                "server": ("127.0.0.1", 8765),
            }
            await app(scope, receive, send)
            return int(next(m for m in sent if m["type"] == "http.response.start")["status"])

        return list(await asyncio.gather(*(one() for _ in range(4))))

    assert asyncio.run(four()) == [200] * 4
    assert reader.most == 2


def test_an_actions_console_offers_reveal_to_operators_only() -> None:
    app = client([dlq_entry()])
    assert 'class="reveal"' not in app.get("/dlq").text and "log in to reveal" in app.get("/dlq").text
    logged_in(app)
    assert 'class="reveal"' in app.get("/dlq").text
