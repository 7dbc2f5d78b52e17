"""Observability on Apache Kafka, on one running app shared by every check of this module.

Guarantees:
- the lag of a paused tier partition is true: records appended behind its head show in its lag within seconds
  (librdkafka's own lag freezes while a partition is paused; the consumers measure it, runtime/lag.py), and a
  consumer asks its end offsets at most once a second;
- Debian's Prometheus scrapes the app's `/metrics`, and every query of the dashboard (deploy/grafana/) returns
  data from it: no panel names a metric the app does not export; the alert rules load into it.

The app: a source topic whose handler passes `ok` records, fails `flaky` ones once (handled on the 1 s tier:
lateness), fails `stuck` ones on every attempt (they end up waiting on the 5 m tier, paused) and dead-letters
`bad` ones (NonRetryable).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.parse import urlencode
from urllib.request import urlopen

import pytest

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy
from retrytopics.connectors.config import KafkaConfig
from retrytopics.observe.events import Event
from retrytopics.observe.metrics import PrometheusHook

from .conftest import Kit, wait_until

pytestmark = pytest.mark.broker

POLICY = RetryPolicy(delays=["1s", "5m"])
DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


class LagRequests:
    """Counts the end-offset requests of each consumer, from the `lag.measured` events' times."""

    wanted_events = frozenset({Event.LAG_MEASURED})

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.measured_at: dict[str, set[int]] = {}

    def on_event(self, event: Event, data: Mapping[str, object]) -> None:
        with self.lock:
            self.measured_at.setdefault(str(data["consumer"]), set()).add(int(data["measured_at"]))  # type: ignore[call-overload]


@dataclass
class Pipeline:
    app: RetryApp
    metrics: PrometheusHook
    requests: LagRequests
    kit: Kit
    source: str
    slow_tier: str
    port: int
    started_at_ms: float


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pipeline(kafka: KafkaConfig) -> Iterator[Pipeline]:
    name = f"observe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    kit = Kit(kafka)
    source = kit.create(f"{name}-orders", 2)
    metrics, requests = PrometheusHook(failures_by_exception=True), LagRequests()
    overrides: dict[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    # librdkafka's own lag, reported every second: the measured lag must win over it
    overrides.update({**metrics.consumer_properties(), "statistics.interval.ms": 1000})
    app = RetryApp(kafka=kafka, group=f"{name}-billing", consumer_overrides=overrides, hooks=[metrics, requests])

    @app.handler(source, policy=POLICY)
    def handle(record: Record[bytes]) -> None:
        if record.value.startswith(b"bad"):
            raise NonRetryable(ValueError("unreadable order"))
        if record.value.startswith(b"stuck") or (record.value.startswith(b"flaky") and record.retry is None):
            raise TimeoutError("downstream timed out")

    app.provision()
    metrics.track_health(lambda: bool(app.healthy))
    port = _free_port()
    metrics.serve(port, addr="127.0.0.1")
    started_at_ms = time.time() * 1000
    app.start(main=True, tiers="all")
    try:
        records = [(f"k{i}".encode(), f"{kind}-{i}".encode(), []) for i, kind in enumerate(["ok"] * 8 + ["flaky"] * 4)]
        records += [(b"s", b"stuck-0", []), (b"b", b"bad-0", [])]
        kit.produce(source, records)
        yield Pipeline(app, metrics, requests, kit, source, app.topics(source).tiers[1].topic, port, started_at_ms)
    finally:
        app.stop()


def _value(metrics: PrometheusHook, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_paused_tier_partitions_lag_moves_when_records_are_added_behind_its_head(pipeline: Pipeline) -> None:
    # setup: the stuck record waits on the 5 m tier, its partition paused, its lag 1
    metrics, tier = pipeline.metrics, pipeline.slow_tier
    wait_until(lambda: _value(metrics, "retrytopics_paused_partitions", topic=tier) == 1, 60, "the 5 m tier paused")
    wait_until(lambda: _value(metrics, "retrytopics_consumer_lag", topic=tier) == 1, 30, "the tier's lag is 1")

    # when: three records are appended to each partition, so behind the paused head (those of the other partition
    # are read at once: a tier record without retry headers is dead-lettered, invalid_retry_headers)
    for partition in range(2):
        pipeline.kit.produce(tier, [(b"x", b"behind", [])] * 3, partition=partition)

    # then: the lag says 4 while the partition stays paused
    wait_until(lambda: _value(metrics, "retrytopics_consumer_lag", topic=tier) == 4, 20, "the paused tier's lag moved")
    assert _value(metrics, "retrytopics_paused_partitions", topic=tier) == 1
    # and each consumer asked its end offsets at most once a second since the app started (one answer: one
    # `measured_at`, shared by its partitions)
    elapsed_s = (time.time() * 1000 - pipeline.started_at_ms) / 1000
    with pipeline.requests.lock:
        answers = {consumer: len(times) for consumer, times in pipeline.requests.measured_at.items()}
    assert len(answers) == 3, answers  # the main consumer and both tiers measure
    assert all(count <= elapsed_s + 1 for count in answers.values()), (answers, elapsed_s)


@pytest.fixture(scope="module")
def prometheus(pipeline: Pipeline) -> Iterator[str]:
    """Debian's Prometheus (scripts/setup.sh), a plain process on a free loopback port, scraping the app every
    3 s and loading deploy/alerts.yml; its HTTP API's base address."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus not found: run scripts/setup.sh (it installs Debian's prometheus)")
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="retrytopics-prometheus-") as home:
        config = Path(home, "prometheus.yml")
        config.write_text(
            # a scrape may take seconds on a loaded machine: its timeout is its interval
            "global: {scrape_interval: 3s, scrape_timeout: 3s, evaluation_interval: 3s}\n"
            f"rule_files: [{json.dumps(str(DEPLOY / 'alerts.yml'))}]\n"
            "scrape_configs:\n"
            f"  - {{job_name: billing, static_configs: [{{targets: ['127.0.0.1:{pipeline.port}']}}]}}\n"
        )
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={Path(home, 'data')}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(lambda: _ready(base, process), 60, "Prometheus ready")
            yield base
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _ready(base: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"Prometheus exited: {process.stderr.read().decode() if process.stderr else ''}")
    try:
        with urlopen(f"{base}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except (URLError, OSError):
        return False


def _query(base: str, expr: str) -> list[Any]:
    with urlopen(f"{base}/api/v1/query?{urlencode({'query': expr})}", timeout=10) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def _concrete(expr: str) -> str:
    """A dashboard query as Grafana sends it with every variable at All and a 1 m rate window (deploy/grafana/
    render.py's translation, the one its pictures use); a variable's `label_values(metric, label)` as the PromQL
    that lists those values."""
    found = re.fullmatch(r"label_values\((.*), (\w+)\)", expr)
    return str(_render().concrete(f"count by ({found[2]}) ({found[1]})" if found else expr))


def _render() -> Any:
    spec = importlib.util.spec_from_file_location("retrytopics_render", DEPLOY / "grafana" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prometheus_scrapes_the_app_and_every_dashboard_query_returns_data(pipeline: Pipeline, prometheus: str) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "retrytopics.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) == 15
    # every query answers with at least one series once the app's events have been scraped twice or more
    pending = {_concrete(q) for q in queries}

    def answered() -> bool:
        pending.difference_update({q for q in pending if _query(prometheus, q)})
        return not pending

    try:
        wait_until(answered, 90, "every dashboard query answered", interval_s=1)
    except AssertionError:
        with urlopen(f"{prometheus}/api/v1/targets", timeout=10) as answer:
            raise AssertionError(f"unanswered: {sorted(pending)}; targets: {answer.read()[:2000]!r}") from None
    # and the alert rules loaded into a running Prometheus
    with urlopen(f"{prometheus}/api/v1/rules", timeout=10) as answer:
        rules = json.loads(answer.read())["data"]["groups"][0]["rules"]
    assert len(rules) == 7 and all(rule["health"] == "ok" for rule in rules), rules
