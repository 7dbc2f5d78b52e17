"""The operator console in a real headless browser (Debian's chromium, driven by Playwright; never a downloaded
browser), on a pipeline that a real RetryApp ran on the test broker.

Guarantees: the pipeline page's counts are the topics' (end offsets, DLQ records by reason, read back
independently); each DLQ filter shows exactly the matching records; an id that went tier 1 -> tier 2 -> DLQ
shows those three hops; a replay from the page writes each selected record once and a second click writes
nothing; HTML and script in a record's key, headers, exception text and value render as text and run nothing
(no dialog, no request leaves the console); a read-only console (the CLI's default) offers no action and
refuses a forged POST.

One pipeline, one console and one browser for the module. With RETRYTOPICS_SCREENSHOTS=1 the tests write the
PNGs of docs/console.md into docs/images/.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.broker_process import free_port
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.core.flood_guard import GuardState
from retrytopics.core.flood_records import GuardReport, encode_guard_record
from retrytopics.core.headers import DlqReason, decode

from .conftest import (
    XSS_HEADER,
    XSS_KEY,
    XSS_VALUE,
    Pipeline,
    end_offsets,
    log_in,
    read_topic,
    shot,
    shown_coordinates,
    wait_until,
    written_by_the_replay_shown,
)

pytestmark = pytest.mark.broker


def test_pipeline_page_shows_the_topics_counts(pipeline: Pipeline, console: str, page: Any) -> None:
    """Every stage's record count is its topics' end offsets, and the DLQ by reason is the DLQ's own content,
    updated live (no reload) until every tier and DLQ record is counted."""
    topics = pipeline.app.topics(pipeline.source)
    page.goto(console + "/")
    first_update = page.text_content("#updated")
    # polled from here: the page's CSP forbids evaluating strings, which page.wait_for_function does
    wait_until(lambda: "/chart.svg?at=" in page.get_attribute("#chart", "src"), 15, "the page's script to refresh it")
    assert page.text_content("#updated") != first_update  # refreshed without a reload
    wait_until(
        lambda: page.text_content("#counted") == page.text_content("#counted-of") != "0",
        30,
        "every tier and DLQ record counted",
    )
    stages = page.eval_on_selector_all(
        "#stages tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    shown = {row[1]: int(row[2]) for row in stages}
    expected = {
        t: end_offsets(pipeline.kafka, t) for t in (topics.source, *(t.topic for t in topics.tiers), topics.dlq)
    }
    assert shown == expected and expected[topics.dlq] == 7
    by_reason = page.eval_on_selector_all(
        "#by-reason tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    truth = Counter(decode(list(m.headers())).dlq_reason.value for m in pipeline.dlq_records())
    assert {reason: int(n) for reason, n in by_reason} == truth == {"exhausted": 3, "non_retryable": 4}
    shot(page, "pipeline")


@pytest.mark.parametrize(
    ("query", "matches"),
    [
        ("reason=exhausted", lambda r, m: r.dlq_reason == DlqReason.EXHAUSTED),
        ("exception_type=builtins.KeyError", lambda r, m: r.exception_type == "builtins.KeyError"),
        ("header=trace-id%3Dabc", lambda r, m: ("trace-id", b"abc") in m.headers()),
        ("key=k-7", lambda r, m: m.key() == b"k-7"),
        ("origin_id=evil-1", lambda r, m: r.origin_message_id == "evil-1"),
        ("since=2020-01-01T00:00:00Z", lambda r, m: m.timestamp()[1] >= 1_577_836_800_000),
    ],
)
def test_filters_show_exactly_the_matching_records(
    pipeline: Pipeline, console: str, page: Any, query: str, matches: Callable[[Any, Any], bool]
) -> None:
    """A filter keeps exactly the DLQ records that match it (compared with the DLQ read back), no more."""
    expected = {
        f"{m.partition()}:{m.offset()}" for m in pipeline.dlq_records() if matches(decode(list(m.headers())), m)
    }
    page.goto(f"{console}/dlq?{query}")
    assert shown_coordinates(page) == expected and expected


def test_filter_form_filters_by_reason(pipeline: Pipeline, console: str, page: Any) -> None:
    """The filter form, used as an operator uses it, shows the non-retryable records only."""
    page.goto(console + "/dlq")
    assert len(shown_coordinates(page)) == 7
    shot(page, "dlq")
    page.select_option("select[name=reason]", "non_retryable")
    page.click("#apply")
    page.wait_for_url("**/dlq?*reason=non_retryable*")
    assert set(page.eval_on_selector_all("td.reason", "cells => cells.map(c => c.textContent)")) == {"non_retryable"}
    assert len(shown_coordinates(page)) == 4


def test_lineage_of_an_exhausted_record_shows_its_three_hops(pipeline: Pipeline, console: str, page: Any) -> None:
    """An id that went tier 1 -> tier 2 -> DLQ shows those three hops in time order, and its source record."""
    exhausted = [decode(list(m.headers())) for m in pipeline.dlq_records()]
    origin = next(r.origin_message_id for r in exhausted if r.dlq_reason == DlqReason.EXHAUSTED)
    page.goto(console + "/dlq?reason=exhausted")
    page.click(f"td.origin a:text-is('{origin}')")
    page.wait_for_url("**/lineage?id=*")
    stages = page.eval_on_selector_all("#hops tr.hop td.stage", "cells => cells.map(c => c.textContent)")
    assert stages == ["tier 1", "tier 2", "DLQ"]
    assert pipeline.source in page.text_content("#origin")
    shot(page, "lineage")


def test_html_and_script_in_a_record_render_as_text_and_run_nothing(
    pipeline: Pipeline, console: str, page: Any
) -> None:
    """Key, header, exception type, message, trace and value of a crafted record show as the literal text;
    no dialog opens, no request leaves the console, no element of the payload exists; the secret in the
    message is hidden; every response carries the strict CSP. (Revealing a value needs a login on a console
    with actions.)"""
    log_in(page, console, "ada")
    dialogs: list[str] = []
    foreign: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: None if r.url.startswith(console) else foreign.append(r.url))
    response = page.goto(console + "/dlq?origin_id=evil-1")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert page.text_content("td.key") == XSS_KEY
    assert page.text_content("td.exception") == "<b>evil.Type</b>"
    page.click("summary")
    assert XSS_HEADER in page.text_content("ul.headers")
    message = page.text_content("pre.message")
    assert message.startswith("<svg onload=")  # shown as text
    assert "hunter2" not in page.content()  # the secret in it redacted everywhere: message, trace, raw headers
    page.click("a.reveal")
    page.click("summary")
    assert page.text_content("pre.value") == XSS_VALUE.decode()
    shot(page, "escaped")
    assert page.query_selector("main script, main img[src=x], main svg, main iframe") is None
    page.wait_for_timeout(500)  # let any payload that did get in fire (it must not)
    assert dialogs == [] and foreign == []


def test_replay_from_the_page_writes_each_record_once(pipeline: Pipeline, console: str, page: Any) -> None:
    """Checked records are previewed (nothing written), then replayed to the source once each; a second click
    writes nothing, and the source holds exactly one replay of each."""
    log_in(page, console, "ada")
    page.goto(console + "/dlq?reason=exhausted")
    chosen = shown_coordinates(page)
    assert len(chosen) == 3
    before = end_offsets(pipeline.kafka, pipeline.source)
    page.check("#check-all")
    page.click("#preview")
    page.wait_for_selector("#confirm")
    assert page.text_content("[data-count=selected]") == "3" and page.text_content("#confirm") == "Replay 3 records"
    assert end_offsets(pipeline.kafka, pipeline.source) == before  # the preview wrote nothing
    shot(page, "replay-preview")
    page.click("#confirm")
    page.wait_for_selector("#again")
    assert page.text_content("[data-count=written]") == "3"
    page.click("#again")
    page.wait_for_selector("#again")
    assert page.text_content("[data-count=written]") == "0"
    assert page.text_content("[data-count=skipped_already_replayed]") == "3"
    replayed = written_by_the_replay_shown(page, pipeline.kafka, pipeline.source)
    assert len(replayed) == 3 and sorted(m.value() for m in replayed) == [b"broken-0", b"broken-1", b"broken-2"]


def test_replay_of_a_filter_to_the_first_tier_writes_valid_tier_records(
    pipeline: Pipeline, console: str, page: Any
) -> None:
    """Every record matching a filter (the app's two non-retryable failures) is replayed to the first tier
    once, with retry headers a tier consumer accepts: tier 0, due at once, the failure count reset, the
    replay lineage naming the DLQ record's origin id."""
    log_in(page, console, "grace")
    page.goto(console + "/dlq?reason=non_retryable&exception_type=builtins.ValueError")
    expected = {
        decode(list(m.headers())).origin_message_id
        for m in pipeline.dlq_records()
        if decode(list(m.headers())).exception_type == "builtins.ValueError"
    }
    page.check("input[name=destination][value=first_tier]")
    page.click("#preview-filter")
    page.wait_for_selector("#confirm")
    assert page.text_content("[data-count=selected]") == "2"
    page.click("#confirm")
    page.wait_for_selector("#again")
    assert page.text_content("[data-count=written]") == "2"
    tier = pipeline.app.topics(pipeline.source).tiers[0].topic
    written = [decode(list(m.headers())) for m in written_by_the_replay_shown(page, pipeline.kafka, tier)]
    assert {h.lineage.replay_origin_id for h in written} == expected and len(written) == 2
    assert all(h.tier == 0 and h.reconsume_times == 1 and h.dlq_reason is None for h in written)


def test_read_only_console_offers_no_action_and_refuses_a_forged_post(pipeline: Pipeline, page: Any) -> None:
    """`retrytopics console` without --actions: no checkbox, no replay form, no login; a POST forged to the
    replay endpoint is refused (403) and writes nothing."""
    port = free_port()
    cli = str(Path(sys.executable).with_name("retrytopics"))
    process = subprocess.Popen(
        [
            cli,
            "console",
            "--bootstrap",
            pipeline.kafka.bootstrap,
            "--topic",
            pipeline.source,
            "--group",
            pipeline.group,
            "--delays",
            "200ms,400ms",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert f"read-only) on http://127.0.0.1:{port}/" in process.stdout.readline()
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(base), 30, "the CLI's console to answer")
        page.goto(base + "/dlq")
        assert len(shown_coordinates(page)) >= 7
        assert page.query_selector("input.pick, #replay-form, #login-link") is None
        assert page.text_content("#mode") == "read-only"
        before = end_offsets(pipeline.kafka, pipeline.source)
        forged = urllib.parse.urlencode({"csrf": "x", "step": "run", "records": "0:0", "destination": "original"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(base + "/actions/replay", data=forged.encode()), timeout=10)
        assert refused.value.code == 403
        assert end_offsets(pipeline.kafka, pipeline.source) == before
    finally:
        process.terminate()
        process.wait(10)


def _answers(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/static/console.css", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_an_overlapping_selection_never_replays_a_record_twice(pipeline: Pipeline, console: str, page: Any) -> None:
    """Replay record A alone, then A with B: the second replay writes B only and names the replay that already
    wrote A; the source holds exactly one replay of each (the DLQ record's own replay count never changes, so
    only the replay ledger can tell)."""
    log_in(page, console, "linus")
    page.goto(console + "/dlq?origin_id=traced-1")
    (a,) = shown_coordinates(page)
    page.goto(console + "/dlq?origin_id=evil-1")
    (b,) = shown_coordinates(page)
    page.goto(console + "/dlq")
    page.check(f"input.pick[value='{a}']")
    page.click("#preview")
    page.click("#confirm")
    page.wait_for_selector("#again")
    assert page.text_content("[data-count=written]") == "1"
    first_id = page.text_content("#replay-id")
    page.goto(console + "/dlq")
    page.check(f"input.pick[value='{a}']")
    page.check(f"input.pick[value='{b}']")
    page.click("#preview")
    page.wait_for_selector("#confirm")
    assert page.text_content("[data-count=skipped_replayed_before]") == "1"
    assert first_id in page.text_content("#replayed-before")
    page.click("#confirm")
    page.wait_for_selector("#again")
    assert page.text_content("[data-count=written]") == "1"
    replayed = Counter(
        dict(m.headers() or []).get("retry.replay_origin_id") for m in read_topic(pipeline.kafka, pipeline.source)
    )
    assert replayed[b"traced-1"] == 1 and replayed[b"evil-1"] == 1


def test_pipeline_page_shows_each_processs_flood_guard_live(pipeline: Pipeline, console: str, page: Any) -> None:
    """With a flood-guard topic (docs/flood-guard.md), the page shows each process's guard as its latest report
    says, updated live (no reload) when a process reports again; an operator's reason with HTML in it shows as
    text and runs nothing."""
    topic = pipeline.app.topics(pipeline.source).flood_guard_topic
    ensure_topics(
        make_admin(pipeline.kafka), [TopicSpec(name=topic, partitions=1, config={"cleanup.policy": "compact"})]
    )
    producer = make_producer(pipeline.kafka)

    def report(state: GuardState, reason: str, refused: int) -> None:
        record = GuardReport(
            handler=pipeline.source,
            process="pod-1",
            state=state,
            forced=state is GuardState.OPEN,
            reason=reason,
            at_ms=int(time.time() * 1000),
            changed_at_ms=int(time.time() * 1000),
            openings=1,
            probes=0,
            refused=refused,
            deferred=0,
            open_ms=2_000,
        )
        key, value, _ = encode_guard_record(record, topic, None)
        producer.produce(topic, key=key, value=value, partition=0)
        assert producer.flush(30) == 0

    report(GuardState.OPEN, "by hand (ops@host): <img src=x onerror=alert(1)>", 17)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(console + "/")
    rows = lambda: page.eval_on_selector_all(  # noqa: E731
        "#guards tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    (row,) = rows()
    assert row[:4] == ["pod-1", "open (by hand)", "by hand (ops@host): <img src=x onerror=alert(1)>", "1"]
    assert row[5] == "17"
    # when: the process reports again, closed
    report(GuardState.CLOSED, "probe_succeeded", 40)
    # then: the page shows it without a reload
    wait_until(lambda: rows()[0][1] == "closed", 15, "the page's script to show the new report")
    assert rows()[0][5] == "40"
    assert page.query_selector("main img[src=x]") is None and dialogs == []
