"""The console over a DLQ of hostile records, on Apache Kafka: records written by another tool, an older
version or anyone with WRITE on the DLQ.

Guarantees: one `/dlq` page shows every record (retry headers missing, one missing, a tier with a reason,
1,100 and 10,000 headers, a duplicated replay count, 1 MB values, non-UTF-8 keys, header values and header
keys), runs none of their content, and offers each for selection; a replay preview of the hostile ones
answers and writes nothing;
the memory a page takes does not grow with the records' sizes (a block of whole 1 MB records was held before
they were cut); a body the console will not read is refused from its headers alone, over a real socket.

One DLQ (one module-scoped fixture), one console, one browser page load per concern.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.broker_process import free_port
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin, make_producer
from retrytopics.core.headers import CONSUMER_GROUP, DLQ_REASON, EXCEPTION_MESSAGE, REPLAY_COUNT, TIER, encode

from ..raw_produce import produce_raw_record
from .conftest import TOKEN, end_offsets, log_in, shown_coordinates, wait_until

pytestmark = pytest.mark.broker

#: Large records: written first (oldest), so that the page's first block holds them all with the hostile ones.
LARGE_RECORDS = 120
LARGE_VALUE = 900_000
XSS = "<img src=x onerror=alert(1)>"


@dataclass(frozen=True)
class HostileDlq:
    kafka: KafkaConfig
    source: str
    group: str
    settings: Any
    topics: Any
    hostile: int  # records other than the large ones


def _retry_state(source: str, group: str, offset: int) -> list[tuple[str, bytes]]:
    from retrytopics.core.headers import DlqReason, RetryHeaders

    return encode(
        RetryHeaders(
            reconsume_times=1,
            origin_message_id=f"hostile-{offset}",
            original_topic=source,
            original_partition=0,
            original_offset=offset,
            original_timestamp=-1,
            consumer_group=group,
            tier=None,
            due_at=None,
            first_failed_at=1_700_000_000_000,
            last_failed_at=1_700_000_000_000,
            exception_type="builtins.ValueError",
            exception_message=XSS,
            exception_trace="",
            dlq_reason=DlqReason.NON_RETRYABLE,
        )
    )


@pytest.fixture(scope="module")
def hostile_dlq(kafka: KafkaConfig) -> HostileDlq:
    """A pipeline's topics (nothing consumes them) whose one-partition DLQ holds 120 records of 900 KB, then
    the hostile set."""
    from retrytopics.operator.config import AppSettings
    from retrytopics.operator.ops import pipeline_topics

    uid = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    source, group = f"hostile-orders-{uid}", f"hostile-billing-{uid}"
    settings = AppSettings(topic=source, group=group, delays=("200ms",))
    topics = pipeline_topics(settings)
    specs = [TopicSpec(name=source, partitions=1), *(TopicSpec(name=t.topic, partitions=1) for t in topics.tiers)]
    ensure_topics(make_admin(kafka), [*specs, TopicSpec(name=topics.dlq, partitions=1)])
    producer = make_producer(kafka)
    for i in range(LARGE_RECORDS):
        value = bytes([i % 251]) * LARGE_VALUE
        producer.produce(topics.dlq, key=b"large-%d" % i, value=value, headers=_retry_state(source, group, i))
        producer.poll(0)
    assert producer.flush(60) == 0
    full = _retry_state(source, group, 1000)
    hostile: list[tuple[bytes | None, list[tuple[str, bytes]]]] = [
        (XSS.encode(), [(EXCEPTION_MESSAGE, b"boom"), (DLQ_REASON, b"exhausted")]),
        (b"k-1", [(k, v) for k, v in _retry_state(source, group, 1001) if k != CONSUMER_GROUP]),
        (b"k-2", [*_retry_state(source, group, 1002), (TIER, b"0")]),
        (b"k-3", [*_retry_state(source, group, 1003), *((f"x-{i}", b"y") for i in range(1100))]),
        (b"k-4", [*_retry_state(source, group, 1004), (REPLAY_COUNT, b"1"), (REPLAY_COUNT, b"2")]),
        (b"\xff\xfe\x00", [("x-bin", b"\xff\xfe"), *_retry_state(source, group, 1005)]),
        (b"k-6", [*_retry_state(source, group, 1006), *((f"x-{i}", b"z" * 20) for i in range(10_000))]),
        (None, []),
    ]
    for key, headers in hostile:
        producer.produce(topics.dlq, key=key, value=b"v", headers=headers)
    assert producer.flush(30) == 0
    produce_raw_record(kafka, topics.dlq, 0, key=b"k-8", value=b"v", headers=[(b"\xff\xfe", b"v"), *full_bytes(full)])
    return HostileDlq(
        kafka=kafka, source=source, group=group, settings=settings, topics=topics, hostile=len(hostile) + 1
    )


def full_bytes(headers: list[tuple[str, bytes]]) -> list[tuple[bytes, bytes | None]]:
    return [(k.encode(), v) for k, v in headers]


@pytest.fixture(scope="module")
def hostile_console(hostile_dlq: HostileDlq) -> Iterator[str]:
    """The console with actions on over the hostile DLQ, served by uvicorn in a thread; its base URL."""
    import uvicorn

    from retrytopics.console.reader import PipelineReader
    from retrytopics.console.web import ConsoleOptions, create_app

    reader = PipelineReader(kafka=hostile_dlq.kafka, pipeline=hostile_dlq.settings, topics=hostile_dlq.topics)
    port = free_port()
    app = create_app(ConsoleOptions(actions=True, token=TOKEN, page_size=50), reader)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the console to listen")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_every_hostile_record_shows_runs_nothing_and_can_be_previewed(
    hostile_dlq: HostileDlq, hostile_console: str, page: Any
) -> None:
    """One page load: every hostile record and the newest large ones are shown, each with a checkbox; no
    dialog opens and no request leaves the console; a preview of the hostile ones answers and writes nothing."""
    dialogs: list[str] = []
    foreign: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: None if r.url.startswith(hostile_console) else foreign.append(r.url))
    log_in(page, hostile_console, "ada")  # lands on /dlq: the one page load
    newest = end_offsets(hostile_dlq.kafka, hostile_dlq.topics.dlq)
    expected = {f"0:{o}" for o in range(newest - 50, newest)}  # 50 per page, one partition
    assert shown_coordinates(page) == expected
    picks = page.eval_on_selector_all("input.pick", "boxes => boxes.map(b => b.value)")
    assert set(picks) == expected
    assert page.text_content(f"tr.record[data-coordinates='0:{newest - 1}'] td.exception")  # the bad key named
    assert page.query_selector("main img[src=x]") is None
    before = end_offsets(hostile_dlq.kafka, hostile_dlq.source)
    for offset in range(newest - hostile_dlq.hostile, newest):  # the hostile ones (the large ones are plain)
        page.check(f"input.pick[value='0:{offset}']")
    page.click("#preview")
    page.wait_for_selector("#confirm")
    assert page.text_content("[data-count=selected]") == str(hostile_dlq.hostile)
    assert end_offsets(hostile_dlq.kafka, hostile_dlq.source) == before
    assert dialogs == [] and foreign == []


_PROBE = """
import json, sys
from retrytopics.connectors.config import KafkaConfig
from retrytopics.console.filters import Cursor, DlqFilter
from retrytopics.console.reader import PipelineReader
from retrytopics.console.views import safe_record_view
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import pipeline_topics

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

args = json.loads(sys.argv[1])
settings = AppSettings(topic=args["source"], group=args["group"], delays=("200ms",))
reader = PipelineReader(kafka=KafkaConfig(bootstrap=args["bootstrap"]), pipeline=settings,
                        topics=pipeline_topics(settings))
reader.dlq_page(DlqFilter(), Cursor.parse("0:1"), size=1)  # the client library and the imports warm
before = rss("VmRSS")
page = reader.dlq_page(DlqFilter(), Cursor(), size=args["size"])
views = [safe_record_view(e) for e in page.entries]
print(json.dumps({"grew": rss("VmHWM") - before, "entries": len(views)}))
"""


def test_a_page_of_large_records_takes_memory_bounded_by_the_read_not_by_the_records(
    hostile_dlq: HostileDlq,
) -> None:
    """A page over 120 records of 900 KB (and the hostile ones) read in a fresh process: its peak RSS grows
    by far less than the 108 MB those records weigh (measured: 30 MB; the whole block was held before: 122 MB)."""
    args = {"bootstrap": hostile_dlq.kafka.bootstrap, "source": hostile_dlq.source, "group": hostile_dlq.group}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps({**args, "size": 200})],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["entries"] == LARGE_RECORDS + hostile_dlq.hostile  # every record read, none lost
    assert measured["grew"] < 64 * 1024 * 1024, f"a page grew the RSS by {measured['grew'] / 2**20:.0f} MB"


def _raw(url: str, request: bytes) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)  # headers only: the announced body is never sent
        sock.settimeout(10)
        return sock.recv(4096).decode("latin-1")


def test_a_body_the_console_will_not_read_is_refused_from_its_headers(hostile_console: str) -> None:
    """A 300 MB form, a multipart body, a body with no session: each answered before one byte is sent."""
    head = "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {kind}\r\nContent-Length: {size}\r\n\r\n"
    form = "application/x-www-form-urlencoded"
    cases = [
        ("/logout", form, 300 * 1024 * 1024, "413"),
        ("/actions/replay", "multipart/form-data; boundary=x", 1000, "415"),
        ("/actions/replay", form, 1000, "403"),
        ("/logout", form, 1000, "403"),
    ]
    for path, kind, size, status in cases:
        answer = _raw(hostile_console, head.format(path=path, kind=kind, size=size).encode())
        assert re.match(rf"HTTP/1.1 {status} ", answer), (path, answer[:100])
        assert "content-security-policy:" in answer.lower()
