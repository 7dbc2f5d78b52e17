"""A replay too large for the console hands over to the Spark replay job, started from the page: its dry run
first, its progress followed on its page without a reload, then the real run, which writes each matching
record once (to the source, with the Spark job's replay id and headers)."""

from __future__ import annotations

from typing import Any

import pytest

from retrytopics.console import actions
from retrytopics.core.headers import DlqReason, decode

from .conftest import Pipeline, log_in, wait_until, written_by_the_replay_shown

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def test_a_filter_past_the_consoles_limit_runs_the_spark_replay_from_the_page(
    pipeline: Pipeline, console: str, page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actions, "MAX_SELECTION", 2)  # the console in this process replays at most 2 itself
    exhausted = {
        decode(list(m.headers())).origin_message_id
        for m in pipeline.dlq_records()
        if decode(list(m.headers())).dlq_reason == DlqReason.EXHAUSTED
    }
    log_in(page, console, "linus")
    page.goto(console + "/dlq?reason=exhausted")
    page.click("#preview-filter")
    page.wait_for_selector("#spark-preview")
    assert "--reason exhausted" in page.text_content("#command")
    page.click("#spark-preview")
    page.wait_for_url("**/actions/jobs/*")
    wait_until(
        lambda: shown(page, "#spark-run, #problem"),
        300,
        "the dry run to finish (the page reloads itself when the job's state changes)",
    )
    assert page.query_selector("#problem") is None, page.text_content("#problem")
    assert page.text_content("[data-count=selected]") == "3" and page.text_content("[data-count=written]") == "0"
    page.click("#spark-run")
    page.wait_for_url("**/actions/jobs/*")
    wait_until(lambda: shown(page, "[data-count=written], #problem"), 300, "the replay to finish")
    assert page.query_selector("#problem") is None, page.text_content("#problem")
    assert page.text_content("[data-count=written]") == "3"
    written = written_by_the_replay_shown(page, pipeline.kafka, pipeline.source)
    assert {decode_lineage_origin(m) for m in written} == exhausted and len(written) == 3


def shown(page: Any, selector: str) -> bool:
    """Whether the page shows `selector` now (False while it reloads itself)."""
    from playwright.sync_api import Error

    try:
        return page.query_selector(selector) is not None
    except Error:  # the page's own reload destroyed the context we asked in
        return False


def decode_lineage_origin(message: Any) -> str:
    from retrytopics.core.headers import decode_lineage

    origin = decode_lineage(list(message.headers())).replay_origin_id
    assert origin is not None
    return origin
