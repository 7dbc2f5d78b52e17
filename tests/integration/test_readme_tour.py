"""The README's five-minute tour works as written, run as a user runs it.

The tour's code blocks are taken from README.md itself (so a change there is what this test runs): the
handler module of section 1 becomes `billing/consumers.py` in a clean folder, next to the user's own
`billing/gateway.py` (the tour's `gateway` and `RateLimited` are the user's: a stand-in payment client
that rate-limits an order once, or always fails); the commands of sections 2-4 run as subprocesses in that
folder with the test broker's address, a topic and group of this test, and a free metrics port
substituted. Nothing else is added: no PYTHONPATH, no extra flag, no environment but what the tour exports.
Before: sections 3 and 4 had no bootstrap address anywhere (only `topics create` had `--bootstrap`) and
failed with `kafka.bootstrap=None: required`; the tour now exports KAFKA_BOOTSTRAP_SERVERS once.

What it shows: the handler unit-tests with `make_record`, `call` and `route_for` as section 1 says;
`topics create` makes the tier topics and DLQ the tour names, and `app.provision()` then accepts them; `run` and
one `tiers` process per tier charge good orders, send a non-positive amount straight to the DLQ
(non_retryable), retry a rate-limited order no earlier than its hint and then charge it, and pass an
always-failing order through the 5s and 30s tiers to the 5m tier; `/metrics` answers; `topics describe`
and `dlq peek` print the pipeline and the dead letter; `audit --json` counts it all; the replay's dry run
answers (0 selected: an exhausted record would need the 5 min tier) in words, no Python repr; a SIGTERM
drains every consumer with exit 0 once the failing order waits in the 5m tier (the Spark commands run on).
Run piped, as here, the Spark commands print no progress line on stderr (it is for terminals only), and, cold
drivers run as a user runs them, no warning or log line (spark/test_cli_text.py runs both commands in-process
for their text: it relies on this for the cold run's stderr).

Only the tour's second replay line (`retrytopics replay ... --replay-id fix-1234 --reason exhausted`) is
not run: `...` stands for the flags of the line before, and a real replay is tested in
`integration/spark/test_replay.py`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from retrytopics.connectors.admin import TopicSpec, ensure_topics
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.embedded import free_port
from retrytopics.connectors.kafka import make_admin, make_consumer, make_producer

pytestmark = [pytest.mark.broker, pytest.mark.spark]
README = Path(__file__).resolve().parents[2] / "README.md"
CLI = str(Path(sys.executable).with_name("retrytopics"))
REPRS = re.compile(r"\{'|\['|\bNone\b|\bTrue\b|\bFalse\b")  # a Python repr where text belongs
WARNINGS = re.compile(r"Warning|\bWARN\b")  # FutureWarning, UserWarning, a log4j WARN line

#: The user's own payment client, which the tour's handler calls (the tour leaves it to the reader).
GATEWAY = textwrap.dedent(
    """
    import json
    from datetime import timedelta
    from pathlib import Path


    class RateLimited(Exception):
        def __init__(self, retry_after: timedelta) -> None:
            super().__init__(f"rate limited, retry after {retry_after}")
            self.retry_after = retry_after


    class Gateway:
        \"\"\"Charges into ./charged/<idempotency key>; rate-limits a `rate_limited` order once.\"\"\"

        def charge(self, order: dict, *, idempotency_key: str) -> None:
            charged = Path("charged")
            charged.mkdir(exist_ok=True)
            if order.get("rate_limited") and not (charged / f"{idempotency_key}.limited").exists():
                (charged / f"{idempotency_key}.limited").touch()
                raise RateLimited(retry_after=timedelta(seconds=2))
            if order.get("gateway_down"):
                raise ConnectionError("payment gateway unreachable")
            (charged / idempotency_key).write_text(json.dumps(order))


    gateway = Gateway()
    """
)

#: A user's unit test of the handler, with the helpers the tour names: make_record, call, route_for.
USER_TEST = textwrap.dedent(
    """
    import sys
    from retrytopics import NonRetryable
    from retrytopics.testing import call, make_record, route_for
    from billing.consumers import app, charge

    record = make_record({"amount_cents": 0}, topic=sys.argv[1])
    try:
        call(charge, record)
        raise AssertionError("a zero amount was charged")
    except NonRetryable as exc:
        route = route_for(app, record, exc)
    print(route.kind, route.reason)
    route = route_for(app, make_record({"amount_cents": 5}, topic=sys.argv[1]), TimeoutError("gateway slow"))
    print(route.kind, route.topic)
    """
)


ORDERS = {  # order id -> value
    "o-1": {"amount_cents": 1200},
    "o-2": {"amount_cents": 350},
    "o-zero": {"amount_cents": 0},  # NonRetryable: straight to the DLQ
    "o-limited": {"amount_cents": 990, "rate_limited": True},  # Retry(after=2s): the 5s tier, then charged
    "o-down": {"amount_cents": 10, "gateway_down": True},  # retried through the tiers
}


def tour() -> dict[str, list[str]]:
    """The code blocks of the README's tour by section number: {"1": [python], "2": [python, bash], ...}."""
    text = README.read_text(encoding="utf-8")
    assert "## Five-minute tour" in text, "the README has no tour"
    body = text.split("## Five-minute tour", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for section in re.split(r"^### ", body, flags=re.M)[1:]:
        number = section.split(".", 1)[0]
        blocks[number] = [f"{lang}\n{code}" for lang, code in re.findall(r"```(\w+)\n(.*?)```", section, re.S)]
    return blocks


def commands(block: str) -> Iterator[list[str]]:
    """The command lines of a bash block, continuation lines joined, comments dropped."""
    assert block.startswith("bash\n"), block
    for line in block.split("\n", 1)[1].replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            yield argv


class Tour:
    """Runs the tour's commands in `folder` with this test's broker, topic, group and ports."""

    def __init__(self, folder: Path, kafka: KafkaConfig, topic: str, group: str) -> None:
        self.folder, self.kafka, self.topic, self.group = folder, kafka, topic, group
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "RETRYTOPICS_"))}
        self.env.pop("PYTHONPATH", None)
        self.metrics_port = free_port()

    def python(self, code: str) -> str:
        code = re.sub(r'bootstrap="[^"]*"', f'bootstrap="{self.kafka.bootstrap}"', code)
        code = re.sub(r'group="billing"', f'group="{self.group}"', code)
        return code.replace('"orders"', f'"{self.topic}"')

    def argv(self, argv: list[str]) -> list[str]:
        out = [CLI if argv[0] == "retrytopics" else argv[0]]
        values = {
            "--bootstrap": self.kafka.bootstrap,
            "--topic": self.topic,
            "--group": self.group,
            "--metrics-port": str(self.metrics_port),
        }
        for before, arg in itertools.pairwise(argv):
            out.append(values.get(before, arg))
        return out

    def export(self, argv: list[str]) -> None:
        for assignment in argv[1:]:
            name, _, _value = assignment.partition("=")
            assert name == "KAFKA_BOOTSTRAP_SERVERS", f"the tour exports {name}: teach the test its value"
            self.env[name] = self.kafka.bootstrap

    def run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(argv), cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"{shlex.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        return done

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        """A long-running command; its output goes to `<folder>/<command>-<pid>.log`."""
        log = open(self.folder / "process.log", "w")
        process = subprocess.Popen(self.argv(argv), cwd=self.folder, env=self.env, stdout=log, stderr=log, text=True)
        (self.folder / "process.log").rename(self.folder / f"{argv[1]}-{process.pid}.log")
        return process


def _produce(kafka: KafkaConfig, topic: str) -> None:
    """The upstream producer: JSON orders keyed by order id, the id also in the `order-id` header."""
    producer = make_producer(kafka)
    for order_id, value in ORDERS.items():
        producer.produce(
            topic, key=order_id.encode(), value=json.dumps(value).encode(), headers=[("order-id", order_id.encode())]
        )
    assert producer.flush(30) == 0


def _keys(kafka: KafkaConfig, topic: str) -> list[str]:
    """The keys of the records in `topic` up to its end offsets as of now (read until the position reaches
    them, not for a fixed idle time)."""
    consumer = make_consumer(kafka, group_id=None)
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in metadata.partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
        keys, deadline = [], time.monotonic() + 10
        while time.monotonic() < deadline:
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] for tp in positions if ends[tp.partition] > 0):
                return keys
            for message in consumer.consume(100, 0.2):
                if message.error() is None:
                    keys.append(message.key().decode())
        return keys
    finally:
        consumer.close()


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _quiet(done: subprocess.CompletedProcess[str]) -> None:
    """Piped, a Spark command writes no progress line (no redraws, no step or note text), and a cold one, as
    a user runs it, no warning or log line either (pandas' FutureWarning in the Python workers, log4j's WARN
    lines; not the JVM's own `WARNING:` notice): pytest's filters do not reach a subprocess."""
    assert "\r" not in done.stderr and "\x1b[" not in done.stderr, done.stderr[-2000:]
    assert "Spark session started" not in done.stderr and "records/s" not in done.stderr, done.stderr[-2000:]
    assert not [line for line in done.stderr.splitlines() if WARNINGS.search(line)], done.stderr[-3000:]


@pytest.mark.timeout(900)  # two Spark driver JVMs beside a 35 s walk through two tiers, on a shared machine
def test_the_readme_tour_works_as_written(
    kafka: KafkaConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    blocks = tour()
    topic, group = unique_name("orders"), unique_name("billing")
    tour_run = Tour(tmp_path, kafka, topic, group)
    tiers = [f"{topic}.{group}.retry.{d}" for d in ("5s", "30s", "5m")]
    dlq = f"{topic}.{group}.dlq"

    # 1. the handler module, beside the user's own gateway; "orders" is the user's existing topic
    (tmp_path / "billing").mkdir()
    (tmp_path / "billing" / "__init__.py").write_text("")
    (tmp_path / "billing" / "gateway.py").write_text(GATEWAY)
    (handler,) = blocks["1"]
    assert handler.startswith("python\n")
    module = tour_run.python(handler.split("\n", 1)[1])
    (tmp_path / "billing" / "consumers.py").write_text("from billing.gateway import RateLimited, gateway\n\n" + module)
    # ... a plain function, unit-tested with retrytopics.testing as the tour says (no broker; it runs beside
    # the next steps, which do not depend on it)
    user_test = subprocess.Popen(
        [sys.executable, "-c", USER_TEST, topic],
        cwd=tmp_path,
        env=tour_run.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ensure_topics(make_admin(kafka), [TopicSpec(name=topic, partitions=3)])

    # 2. provision (the command, then the Python call, which finds everything there), run main and tiers
    python_block, bash_block = blocks["2"]
    started: list[subprocess.Popen[str]] = []
    try:
        for argv in commands(bash_block):
            if argv[0] == "export":
                tour_run.export(argv)
            elif argv[1:3] == ["topics", "create"]:
                created = tour_run.run(argv).stdout
                assert all(name in created for name in [*tiers, dlq]), created
            else:
                assert argv[1] in ("run", "tiers"), argv
                started.append(tour_run.start(argv))
                if argv[1] == "tiers":  # the tour runs one tier per process: so do we, for every tier
                    tier = argv[argv.index("--tier") + 1]
                    started += [tour_run.start([*argv[:-1], other]) for other in ("5s", "30s", "5m") if other != tier]
        assert [p.args[1] for p in started] == ["run", "tiers", "tiers", "tiers"], "the tour runs main and tiers"
        provision = next(line for line in python_block.splitlines() if line.startswith("app.provision()"))
        subprocess.run(
            [sys.executable, "-c", f"from billing.consumers import app\n{provision}"],
            cwd=tmp_path,
            env=tour_run.env,
            check=True,
            timeout=60,
        )
        _produce(kafka, topic)
        produced = time.monotonic()
        # the first failures are written at once: the bad order to the DLQ, the two others to the 5s tier
        _wait(lambda: _keys(kafka, dlq) == ["o-zero"], 30, "the non-retryable order in the DLQ")
        _wait(lambda: sorted(_keys(kafka, tiers[0])) == ["o-down", "o-limited"], 30, "both failures in the 5s tier")

        # 3. watch it, and 4. the replay's dry run (the only exhausted record would need 5 min in the last
        # tier: none selected). The commands run side by side, as an operator may run them in two terminals,
        # while the app charges o-limited from the 5s tier and o-down walks through the tiers: each reads what
        # is already written (o-zero in the DLQ, o-limited and o-down in the first tier), and the two Spark
        # drivers boot at once.
        describe, peek, audit = commands(blocks["3"][0])
        dry_run, real_run = commands(blocks["4"][0])
        assert "--dry-run" in dry_run and "..." in real_run
        with ThreadPoolExecutor(max_workers=4) as commands_running:
            audit_run = commands_running.submit(tour_run.run, audit, 420)
            dry_run_run = commands_running.submit(tour_run.run, dry_run, 420)
            describe_run = commands_running.submit(tour_run.run, describe)
            peek_run = commands_running.submit(tour_run.run, peek)

            # then: good orders charged, the rate-limited one after its tier (never early), the bad one not
            charged = tmp_path / "charged"
            _wait(lambda: {"o-1", "o-2", "o-limited"} <= {p.name for p in charged.glob("o-*")}, 90, "the charges")
            assert time.monotonic() - produced >= 4.5, "the rate-limited order was charged before its 5s tier"
            assert not (charged / "o-zero").exists() and not (charged / "o-down").exists()
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{tour_run.metrics_port}/metrics", timeout=5).read()
            assert b"retrytopics_healthy 1.0" in metrics
            out, err = user_test.communicate(timeout=60)
            assert out.split() == ["dlq", "non_retryable", "tier", f"{topic}.{group}.retry.5s"], err

            described = describe_run.result().stdout
            assert all(name in described for name in [topic, *tiers]), described
            peeked = peek_run.result().stdout
            assert "o-zero" in peeked and "non_retryable" in peeked and "invalid amount" in peeked, peeked

            # the always-failing order went through the 5s and the 30s tier processes to the 5m tier
            _wait(lambda: "o-down" in _keys(kafka, tiers[2]), 240, "o-down in the 5m tier")

            # nothing is left to handle for 5 minutes: the app stops while the Spark commands still run
            for process in started:
                process.send_signal(signal.SIGTERM)
            for process in started:
                log = tmp_path / f"{process.args[1]}-{process.pid}.log"  # type: ignore[index]
                assert process.wait(timeout=60) == 0, log.read_text()[-3000:]

            audited = audit_run.result()
            _quiet(audited)
            summary = json.loads(audited.stdout)
            stages = {s["topic"]: s["records"] for s in summary["stages"]}
            assert stages[topic] == len(ORDERS) and stages[tiers[0]] == 2, stages  # o-limited and o-down
            assert summary["dlq"]["by_reason"] == {"non_retryable": 1}

            replayed = dry_run_run.result()
            _quiet(replayed)
            assert not REPRS.search(replayed.stdout), replayed.stdout
            assert replayed.stdout.splitlines()[0] == "replay fix-1234 to the original topic: nothing written (dry run)"
            assert re.search(r"^would write +0$", replayed.stdout, re.M), replayed.stdout
    finally:
        for process in [*started, user_test]:
            if process.poll() is None:
                process.kill()
