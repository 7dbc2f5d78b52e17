"""Console child role: the operator console serving a pipeline whose DLQ holds the scenario's records, and
the requests an operator makes first, timed from inside the process (so the parent's RSS samples are the
console's alone: its tally of every tier and DLQ record runs meanwhile, as it does in use).

Imported only for scenario 8 (it needs the `console` extra).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import uvicorn

from bench.measure import emit
from retrytopics.connectors.broker_process import free_port
from retrytopics.connectors.config import KafkaConfig
from retrytopics.console.reader import PipelineReader
from retrytopics.console.web import ConsoleOptions, create_app
from retrytopics.core.durations import format_duration
from retrytopics.operator.config import AppSettings
from retrytopics.operator.ops import pipeline_topics

__all__ = ["console_serve"]


def _timed_get(url: str) -> tuple[float, bytes]:
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=600) as response:
        body = response.read()
    return time.monotonic() - start, body


def console_serve(args: dict[str, Any]) -> None:
    """Serve the console (args: bootstrap, source, group, delays_ms), then time: the first DLQ page (cold),
    a page filtered to a third of the records, a filter matching nothing (the scan budget), the pipeline
    page, and the tally's count of every record. Reports "ready", "pages" and "done"."""
    pipeline = AppSettings(
        topic=args["source"], group=args["group"], delays=tuple(format_duration(ms) for ms in args["delays_ms"])
    )
    reader = PipelineReader(
        kafka=KafkaConfig(bootstrap=args["bootstrap"]), pipeline=pipeline, topics=pipeline_topics(pipeline)
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(ConsoleOptions(), reader), host="127.0.0.1", port=port, log_level="warning", log_config=None
        )
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    started = time.monotonic()
    reader.start_tally()
    base = f"http://127.0.0.1:{port}"
    emit("ready")
    first, body = _timed_get(base + "/dlq")
    rows = body.count(b'class="record"')
    filtered, _ = _timed_get(base + "/dlq?exception_type=bench.BadData")
    nothing, _ = _timed_get(base + "/dlq?origin_id=no-such-id")
    pipeline_s, _ = _timed_get(base + "/")
    emit(
        "pages",
        first_page_s=first,
        rows=rows,
        filtered_page_s=filtered,
        no_match_page_s=nothing,
        pipeline_page_s=pipeline_s,
    )
    while True:
        counted = json.loads(_timed_get(base + "/api/pipeline")[1])["counted"]
        if counted["records"] >= counted["of"] > 0:
            break
        time.sleep(0.5)
    emit("done", tally_s=time.monotonic() - started, counted=counted["records"])
    server.should_exit = True
    reader.stop()
