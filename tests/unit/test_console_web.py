"""The console's web layer without a broker (a fake reader, Starlette's test client): record content is
escaped, every response carries the strict CSP, the token never reaches the browser, actions need a session
and its CSRF token, a foreign Host is refused, and the replay's pure plan follows `retrytopics replay`'s rules."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from retrytopics.console import actions
from retrytopics.console.entries import Entry, entry_of
from retrytopics.console.filters import Cursor, DlqFilter
from retrytopics.console.paging import Page
from retrytopics.console.tally import Tally
from retrytopics.console.web import CONTENT_SECURITY_POLICY, ConsoleOptions, create_app
from retrytopics.core.errors import ConfigError
from retrytopics.core.flood_guard import GuardState
from retrytopics.core.flood_records import GuardAction, GuardCommand, GuardReport
from retrytopics.core.headers import (
    ORIGIN_MESSAGE_ID,
    REPLAY_COUNT,
    REPLAY_ID,
    REPLAY_ORIGIN_ID,
    TIER,
    DlqReason,
    Lineage,
    RetryHeaders,
    decode,
    encode,
)
from retrytopics.core.naming import topics_for
from retrytopics.core.signing import HeaderKeys, sign
from retrytopics.operator.config import AppSettings
from retrytopics.operator.guard import FloodGuardView
from retrytopics.operator.ops import PartitionState

TOPICS = topics_for("orders", "billing", [200, 400])
TOKEN = "unit-test-token-0123456789"
PAYLOAD = "<script>alert(1)</script>"


def state(
    *,
    origin: str = "o-1",
    original_partition: int = 0,
    original_offset: int = 7,
    topic: str = "orders",
    message: str = PAYLOAD,
    replay_count: int = 0,
) -> RetryHeaders:
    return RetryHeaders(
        reconsume_times=2,
        origin_message_id=origin,
        original_topic=topic,
        original_partition=original_partition,
        original_offset=original_offset,
        original_timestamp=-1,
        consumer_group="billing",
        tier=None,
        due_at=None,
        first_failed_at=1,
        last_failed_at=2,
        exception_type="<b>x.Err</b>",
        exception_message=message,
        exception_trace="trace " + PAYLOAD,
        dlq_reason=DlqReason.EXHAUSTED,
        lineage=Lineage(replay_count=replay_count),
    )


def dlq_entry(
    offset: int = 0,
    *,
    retry: RetryHeaders | None = None,
    extra: Iterable[tuple[str, bytes | None]] = (),
    key: bytes | None = PAYLOAD.encode(),
) -> Entry:
    headers = [("x-note", PAYLOAD.encode()), *extra, *encode(retry or state(original_offset=offset))]
    return entry_of(
        topic=TOPICS.dlq,
        partition=0,
        offset=offset,
        timestamp_ms=1000 + offset,
        key=key,
        value=PAYLOAD.encode(),
        headers=headers,
        whole=True,
    )


class FakeReader:
    """What the web layer reads, from memory."""

    kafka: Any = None
    topics = TOPICS

    def __init__(self, entries: list[Entry], guard: FloodGuardView | None = None) -> None:
        self.entries = entries
        self.tally = Tally()
        self.guard = guard

    def flood_guard(self) -> FloodGuardView | None:
        return self.guard

    def partition_states(self) -> list[PartitionState]:
        return [
            PartitionState(
                topic=TOPICS.dlq,
                kind="dlq",
                partition=0,
                end_offset=len(self.entries),
                committed=None,
                lag=None,
                state="-",
                replicas=1,
                in_sync_replicas=1,
                min_insync_replicas=None,
            )
        ]

    def counted(self) -> tuple[int, int]:
        return 0, 0

    def snapshot(self, view: Callable[[Tally], Any]) -> Any:
        return view(self.tally)

    def dlq_page(self, chosen: DlqFilter, cursor: Cursor, *, size: int) -> Page:
        return Page(
            entries=[e for e in self.entries if chosen.matches(e)][:size],
            next=None,
            scanned=len(self.entries),
            budget_spent=False,
        )

    def records_at(self, topic: str, coordinates: Iterable[tuple[int, int]], *, whole: bool = False) -> list[Entry]:
        wanted = set(coordinates)
        return [e for e in self.entries if (e.partition, e.offset) in wanted]

    pipeline = AppSettings(topic="orders", group="billing", delays=("200ms", "400ms"))

    def matching(self, chosen: DlqFilter, *, limit: int) -> tuple[list[tuple[int, int]], bool]:
        found = [(e.partition, e.offset) for e in self.entries if chosen.matches(e)]
        return found[:limit], len(found) > limit

    def lineage(self, origin_id: str) -> tuple[Entry | None, list[Entry]]:
        return None, [e for e in self.entries if e.origin_id == origin_id]


def client(actions_on: bool = False, entries: list[Entry] | None = None) -> TestClient:
    options = ConsoleOptions(actions=actions_on, token=TOKEN if actions_on else None)
    reader = FakeReader(entries if entries is not None else [dlq_entry()])
    return TestClient(create_app(options, reader), base_url="http://127.0.0.1")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/dlq",
        "/dlq?reveal=0:0",
        "/lineage?id=o-1",
        "/chart.svg",
        "/api/pipeline",
        "/static/console.js",
        "/dlq?since=nonsense",
    ],
)
def test_every_response_carries_the_strict_csp_and_no_raw_payload(path: str) -> None:
    response = client().get(path)
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"
    assert PAYLOAD not in response.text or path == "/api/pipeline"  # JSON is data, set with textContent


def test_record_content_is_escaped_and_the_value_masked_until_revealed() -> None:
    page = client().get("/dlq").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;x.Err&lt;/b&gt;" in page
    assert 'class="value"' not in page and "reveal" in page
    revealed = client().get("/dlq?reveal=0:0").text
    assert '<pre class="value">&lt;script&gt;' in revealed
    assert not re.search(r"<script>(?!</script>)", page.replace('<script src="/static/console.js" defer></script>', ""))


def test_a_bad_filter_is_a_400_naming_it() -> None:
    response = client().get("/dlq?since=yesterday")
    assert response.status_code == 400 and "since" in response.text


def test_a_foreign_host_is_refused_on_loopback() -> None:
    assert client().get("/", headers={"host": "attacker.example"}).status_code == 400


def test_read_only_refuses_every_action() -> None:
    app = client()
    assert "replay-form" not in app.get("/dlq").text and "/login" not in app.get("/dlq").text
    assert app.post("/actions/replay", data={"records": "0:0", "step": "run", "csrf": "x"}).status_code == 403
    assert app.post("/login", data={"operator": "eve", "token": TOKEN}).status_code == 403


def test_actions_need_a_session_and_its_csrf_token_and_the_token_never_reaches_the_browser() -> None:
    app = client(actions_on=True)
    assert app.post("/actions/replay", data={"records": "0:0", "step": "run"}).status_code == 403  # no session
    assert app.post("/login", data={"operator": "eve", "token": "wrong" * 5}).status_code == 403
    response = app.post("/login", data={"operator": "ada", "token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and TOKEN not in cookie
    page = app.get("/dlq").text
    assert 'name="records"' in page and TOKEN not in page
    refused = app.post("/actions/replay", data={"records": "0:0", "step": "preview", "csrf": "forged"})
    assert refused.status_code == 403  # a session, but not its CSRF token: what a cross-site form sends


def test_actions_without_a_token_or_with_a_short_one_are_refused_at_start() -> None:
    from retrytopics.console.sessions import Sessions

    with pytest.raises(ConfigError) as refused:
        ConsoleOptions(actions=True)
    assert refused.value.field == "console.token"
    with pytest.raises(ConfigError) as short:
        Sessions("short", clock=lambda: 0.0)
    assert short.value.field == "console.token"


def request(*coordinates: tuple[int, int], **kw: Any) -> actions.ReplayRequest:
    return actions.ReplayRequest(replay_id="r-1", coordinates=coordinates or ((0, 0),), **kw)


def test_the_plan_skips_foreign_invalid_duplicate_and_looped_records() -> None:
    good = dlq_entry(0)
    again = dlq_entry(1, retry=state(original_offset=0))  # the same source record, a later episode
    foreign = dlq_entry(2, retry=state(topic="elsewhere"))
    wrong_partition = dlq_entry(3, retry=state(original_partition=5))
    looped = dlq_entry(4, retry=state(original_offset=4, replay_count=1))
    broken = entry_of(
        topic=TOPICS.dlq, partition=0, offset=5, timestamp_ms=0, key=None, value=None, headers=[(TIER, b"x")]
    )
    plan = actions.plan_replay(
        [good, again, foreign, wrong_partition, looped, broken], topics=TOPICS, request=request(), source_partitions=2
    )
    assert [(e.offset, t) for e, t in plan.writes] == [(1, "orders")]
    assert plan.counts == {
        "selected": 6,
        "skipped_foreign": 1,
        "skipped_invalid": 2,
        "skipped_duplicates": 1,
        "skipped_reference_only": 0,
        "skipped_headers_dropped": 0,
        "skipped_max_replays": 1,
        "skipped_replayed_before": 0,
        "parked": 0,
    }
    assert plan.problems == {"0:3": "original_partition", "0:5": "headers"}
    parked = actions.plan_replay([looped], topics=TOPICS, request=request(park=True), source_partitions=2)
    assert [t for _, t in parked.writes] == [f"{TOPICS.dlq}.parked"]


def test_the_plan_writes_in_source_order_and_refuses_a_key_ordered_sequence_to_the_first_tier() -> None:
    """As the Spark replay: records go back in the order they first came (original offsets 5, 9, 12), not in
    DLQ order (12, 5, 9), so a dead-lettered head and the `blocked_by_key` records behind it stay in sequence;
    to the first tier such a sequence (a `blocked_by_key` record, or the head one of them names) is refused,
    naming the records, while the original topic takes it."""
    from dataclasses import replace

    def blocked(offset: int, original_offset: int, behind: int) -> Entry:
        follower = replace(
            state(original_offset=original_offset, origin=f"o-{original_offset}"),
            reconsume_times=0,
            dlq_reason=DlqReason.BLOCKED_BY_KEY,
            exception_message=f"behind orders-0-{behind} (dead-lettered: exhausted)",
        )
        return dlq_entry(offset, retry=follower)

    head = dlq_entry(1, retry=state(original_offset=5, origin="o-5"))
    plan = actions.plan_replay(
        [blocked(0, 12, 9), head, blocked(2, 9, 5)], topics=TOPICS, request=request(), source_partitions=1
    )
    assert [(e.offset, e.retry.original_offset if e.retry else None) for e, _ in plan.writes] == [
        (1, 5),
        (2, 9),
        (0, 12),
    ]
    to_tier = request(destination="first_tier")
    with pytest.raises(ConfigError) as refused:
        actions.plan_replay([head, blocked(2, 9, 5)], topics=TOPICS, request=to_tier, source_partitions=1)
    assert refused.value.field == "destination" and "(0:1, 0:2)" in str(refused.value)
    with pytest.raises(ConfigError, match=r"\(0:2\)"):
        actions.plan_replay([blocked(2, 9, 5)], topics=TOPICS, request=to_tier, source_partitions=1)
    # a head selected without its followers is not recognised (the console sees the selection only)
    alone = actions.plan_replay([head], topics=TOPICS, request=to_tier, source_partitions=1)
    assert [(e.offset, t) for e, t in alone.writes] == [(1, TOPICS.tiers[0].topic)]


def test_a_reference_or_a_record_without_its_headers_is_skipped_never_written() -> None:
    """As the Spark replay: a too-large reference's value and a too_many_headers record are not the record's."""
    from dataclasses import replace

    from retrytopics.core.router import too_large_reference

    too_large = replace(state(original_offset=0), dlq_reason=DlqReason.TOO_LARGE)
    reference = dlq_entry(0, retry=too_large)
    reference = entry_of(
        topic=TOPICS.dlq,
        partition=0,
        offset=0,
        timestamp_ms=1000,
        key=None,
        value=too_large_reference("orders.billing.retry.1s", 0, 3, b"x" * 10),
        headers=list(reference.headers),
        whole=True,
    )
    own_json = entry_of(
        topic=TOPICS.dlq,
        partition=0,
        offset=1,
        timestamp_ms=1001,
        key=None,
        value=b'{"too_large": true, "note": "mine"}',
        headers=list(dlq_entry(1, retry=replace(too_large, original_offset=1)).headers),
        whole=True,
    )
    dropped = dlq_entry(2, retry=replace(state(original_offset=2), dlq_reason=DlqReason.TOO_MANY_HEADERS))
    plan = actions.plan_replay([reference, own_json, dropped], topics=TOPICS, request=request(), source_partitions=1)
    assert [e.offset for e, _ in plan.writes] == [1]
    assert (plan.counts["skipped_reference_only"], plan.counts["skipped_headers_dropped"]) == (1, 1)


def test_a_replayed_record_carries_a_mark_that_attributes_it_to_its_replay() -> None:
    from retrytopics.core.signing import replay_mark

    record = dlq_entry(0)
    headers = dict(
        actions.replay_headers(record, to_tier=False, replay_id="r-1", now_ms=99, topic="orders", mark_key=b"n" * 32)
    )
    assert headers[actions.REPLAY_MARK] == replay_mark(b"n" * 32, "r-1", "orders", "orders-0-0").encode()
    assert actions.REPLAY_MARK not in dict(actions.replay_headers(record, to_tier=False, replay_id="r-1", now_ms=99))


def test_with_header_keys_an_unsigned_record_is_invalid_and_a_tier_replay_is_signed() -> None:
    keys = HeaderKeys.of("k" * 32)
    unsigned = dlq_entry(0)
    signed_headers = list(sign(keys, TOPICS.dlq, unsigned.key, unsigned.value, list(unsigned.headers)))
    signed = entry_of(
        topic=TOPICS.dlq,
        partition=0,
        offset=1,
        timestamp_ms=0,
        key=unsigned.key,
        value=unsigned.value,
        headers=signed_headers,
        whole=True,
    )
    plan = actions.plan_replay(
        [unsigned, signed],
        topics=TOPICS,
        request=request(destination="first_tier"),
        source_partitions=1,
        header_keys=keys,
    )
    assert plan.problems == {"0:0": "signature"} and [e.offset for e, _ in plan.writes] == [1]


def test_replayed_headers_keep_user_headers_and_add_the_lineage() -> None:
    record = dlq_entry(0, extra=[("trace-id", b"\xff\x00")])
    to_source = actions.replay_headers(record, to_tier=False, replay_id="r-1", now_ms=99)
    assert to_source[:2] == [("x-note", PAYLOAD.encode()), ("trace-id", b"\xff\x00")]
    assert dict(to_source[2:]) == {
        REPLAY_ID: b"r-1",
        "retry.replayed_at": b"99",
        REPLAY_COUNT: b"1",
        REPLAY_ORIGIN_ID: b"o-1",
        actions.REPLAY_ORIGINAL: b"orders-0-0",
    }
    to_tier = actions.replay_headers(record, to_tier=True, replay_id="r-1", now_ms=99)
    tier_state = decode(to_tier)
    assert (tier_state.tier, tier_state.due_at, tier_state.reconsume_times, tier_state.dlq_reason) == (0, 99, 1, None)
    assert tier_state.lineage.replay_id == "r-1" and dict(to_tier)[ORIGIN_MESSAGE_ID] == b"o-1"


def test_the_replay_original_header_is_the_ledgers() -> None:
    ledger = pytest.importorskip("retrytopics.spark.ledger")
    assert (actions.REPLAY_ORIGINAL, actions.REPLAY_MARK) == (ledger.REPLAY_ORIGINAL, ledger.REPLAY_MARK)


def test_the_same_selection_gets_the_same_replay_id() -> None:
    first = actions.replay_id_for("original", [(0, 1), (1, 2)])
    assert first == actions.replay_id_for("original", [(1, 2), (0, 1), (0, 1)])
    assert first != actions.replay_id_for("first_tier", [(0, 1), (1, 2)])
    assert first != actions.replay_id_for("original", [(0, 1)])


def test_a_filter_matching_more_than_the_console_replays_hands_over_to_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is written; the page gives the `retrytopics replay` command for the same selection."""
    monkeypatch.setattr(actions, "MAX_SELECTION", 2)
    app = client(actions_on=True, entries=[dlq_entry(i) for i in range(3)])
    app.post("/login", data={"operator": "ada", "token": TOKEN})
    csrf = re.search(r'name="csrf" value="([^"]+)"', app.get("/dlq").text)
    assert csrf is not None
    response = app.post(
        "/actions/replay",
        data={
            "csrf": csrf.group(1),
            "selection": "filter",
            "reason": "exhausted",
            "destination": "original",
            "step": "run",
        },
    )
    assert "Too many records" in response.text
    command = re.search(r'<pre id="command">([^<]+)</pre>', response.text)
    assert command is not None and command.group(1).startswith(
        "retrytopics replay --topic orders --group billing --delays 200ms,400ms --replay-id REPLAY_ID --to original "
        "--dry-run --reason exhausted"
    )


def test_the_spark_command_carries_every_filter_it_can() -> None:
    chosen = DlqFilter.from_query(
        {"exception_type": ["a.B"], "since": ["10"], "until": ["20"], "origin_id": ["o'1"], "key": ["k"]}
    )
    command = actions.spark_replay_command(chosen, pipeline=["--topic", "t"], destination="first_tier")
    assert "--exception-type a.B --since 10 --until 20" in command and "--origin-ids FILE" in command
    assert "key or header filter" in command and "--to first_tier" in command


def test_a_cross_origin_post_is_refused_even_with_a_session_and_its_csrf_token() -> None:
    app = client(actions_on=True)
    app.post("/login", data={"operator": "ada", "token": TOKEN})
    csrf = re.search(r'name="csrf" value="([^"]+)"', app.get("/dlq").text)
    assert csrf is not None
    refused = app.post(
        "/actions/replay", data={"csrf": csrf.group(1), "records": "0:0"}, headers={"origin": "http://attacker.example"}
    )
    assert refused.status_code == 403 and "another site" in refused.text


def test_a_revealed_value_goes_through_the_apps_deserializer_and_its_refusal_shows() -> None:
    def render(entry: Entry) -> Any:
        if entry.offset == 1:
            raise ValueError("not JSON")
        return {"order": "<o-1>"}

    reader = FakeReader([dlq_entry(0), dlq_entry(1)])
    app = TestClient(create_app(ConsoleOptions(render=render), reader), base_url="http://127.0.0.1")  # type: ignore[arg-type]
    assert "&#34;order&#34;: &#34;&lt;o-1&gt;&#34;" in app.get("/dlq?reveal=0:0").text  # rendered, then escaped
    refused = app.get("/dlq?reveal=0:1").text
    assert "the app&#39;s deserializer refused it: ValueError" in refused and "&lt;script&gt;" in refused


def test_spark_jobs_refuse_key_and_header_filters_and_a_second_job_at_once() -> None:
    from retrytopics.console.jobs import SparkJobs, SparkReplay, spark_replay_id

    jobs = SparkJobs(None, TOPICS, None)  # type: ignore[arg-type]
    for query in ({"key": ["k"]}, {"header": ["a=b"]}):
        with pytest.raises(ConfigError) as refused:
            jobs.start(DlqFilter.from_query(query), destination="original", replay_id="r", dry_run=True, operator="ada")
        assert refused.value.field == "filter"
    chosen = DlqFilter.from_query({"reason": ["exhausted"]})
    running = SparkReplay(
        job_id="j", filter=chosen, destination="original", replay_id="r", dry_run=True, operator="ada", state="running"
    )
    jobs._jobs["j"] = running
    with pytest.raises(ConfigError) as busy:
        jobs.start(chosen, destination="original", replay_id="r", dry_run=True, operator="ada")
    assert busy.value.field == "job"
    assert spark_replay_id(chosen, "original") == spark_replay_id(
        DlqFilter.from_query({"reason": ["exhausted"]}), "original"
    )
    assert spark_replay_id(chosen, "original") != spark_replay_id(chosen, "first_tier")


def test_a_user_header_named_as_a_secret_never_reaches_the_browser() -> None:
    """A header whose name says it holds a credential (`authorization`, `x-api-key`, `password`, `cookie`)
    is shown as [hidden] on the DLQ page whatever its value looks like; other headers are shown."""
    secrets_ = {
        "authorization": b"dXNlcjpodW50ZXIy",
        "x-api-key": b"sk-live-4f9a2c",
        "password": b"hunter2",
        "Cookie": b"sid=3b1e7d",
    }
    entry = dlq_entry(extra=[*secrets_.items(), ("x-region", b"eu-west-1")])
    page = client(entries=[entry]).get("/dlq").text
    for name, value in secrets_.items():
        assert value.decode() not in page, name
        assert f"<code>{name}</code> = <code>[hidden]</code>" in page
    assert "<code>x-region</code> = <code>eu-west-1</code>" in page


def test_the_pipeline_page_shows_each_processs_flood_guard_escaped() -> None:
    """The flood-guard section (docs/console.md): each process's guard from its report, the last command; text
    from the topic (an operator's reason) is escaped like record content."""
    report = GuardReport(
        handler="orders",
        process="pod-7",
        state=GuardState.OPEN,
        forced=True,
        reason=f"by hand (ops@host): {PAYLOAD}",
        at_ms=1,
        changed_at_ms=1,
        openings=3,
        probes=4,
        refused=1234,
        deferred=2,
        open_ms=61_500,
    )
    command = GuardCommand(handler="orders", action=GuardAction.OPEN, reason=PAYLOAD, by="ops@host", at_ms=1)
    view = FloodGuardView(topic=TOPICS.flood_guard_topic, command=command, reports=(report,), untrusted=0)
    reader = FakeReader([dlq_entry()], guard=view)
    web = TestClient(create_app(ConsoleOptions(), reader), base_url="http://127.0.0.1")  # type: ignore[arg-type]
    page = web.get("/").text
    assert "pod-7" in page and "open (by hand)" in page and ">1234<" in page and ">61.5<" in page
    assert PAYLOAD not in page and "&lt;script&gt;" in page
    (process,) = web.get("/api/pipeline").json()["flood_guard"]["processes"]
    assert (process["state"], process["by_hand"], process["openings"], process["probes"]) == ("open", True, 3, 4)
    assert "flood-guard" not in client().get("/").text  # no guard: no section
