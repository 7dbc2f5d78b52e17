"""The command line without a broker: settings reach the app in one documented precedence, the app module
is found from the working directory, missing extras and bad librdkafka properties stop a command before
any work, with the field named, and an unreachable cluster comes with a hint."""

from __future__ import annotations

import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from retrytopics.app import RetryApp
from retrytopics.operator import cli, preflight

_names = itertools.count()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CLI configures the `retrytopics` logger and may extend sys.path; undo both after each test."""
    logger = logging.getLogger("retrytopics")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in os.environ if n.startswith(("RETRYTOPICS_", "KAFKA_"))]:
        monkeypatch.delenv(name)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Writes `<unique>.py` holding a RetryApp into the working directory; returns its MODULE:OBJECT."""
    monkeypatch.chdir(tmp_path)

    def write(**app_options: object) -> str:
        name = f"cli_app_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(
            "from retrytopics import KafkaConfig, RetryApp, RetryPolicy\n"
            f"app = RetryApp(kafka=KafkaConfig(bootstrap='code-host:1', client_id='from-code'), group='billing',"
            f" **{app_options!r})\n"
            "@app.handler('orders', policy=RetryPolicy(delays=['1s']))\n"
            "def handle(record): pass\n"
        )
        monkeypatch.delitem(sys.modules, name, raising=False)
        return f"{name}:app"

    return write


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[RetryApp]:
    """Replaces RetryApp.run/run_tiers: records the app instead of connecting to a broker."""
    apps: list[RetryApp] = []
    monkeypatch.setattr(RetryApp, "run", lambda self: apps.append(self))
    monkeypatch.setattr(RetryApp, "run_tiers", lambda self, tiers="all": apps.append(self))
    return apps


@pytest.mark.parametrize("command", ["run", "tiers"])
@pytest.mark.parametrize(
    ("flag", "env", "toml", "expected"),
    [
        (None, None, None, "code-host:1"),
        (None, None, "toml-host:1", "toml-host:1"),
        (None, "env-host:1", "toml-host:1", "env-host:1"),
        ("flag-host:1", "env-host:1", "toml-host:1", "flag-host:1"),
    ],
)
def test_settings_override_the_apps_own_kafka_config_in_order(
    command: str,
    flag: str | None,
    env: str | None,
    toml: str | None,
    expected: str,
    app_module: Callable[..., str],
    started: list[RetryApp],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = [command, app_module()]
    if flag:
        argv += ["--bootstrap", flag]
    if env:
        monkeypatch.setenv("RETRYTOPICS_KAFKA_BOOTSTRAP", env)
    if toml:
        (tmp_path / "rt.toml").write_text(f'[kafka]\nbootstrap = "{toml}"\n')
        argv += ["--config", str(tmp_path / "rt.toml")]
    assert cli.main(argv) == 0
    (app,) = started
    assert app.kafka.bootstrap == expected
    assert app.kafka.client_id == "from-code", "a setting given nowhere keeps the app's value"


def test_config_file_comes_from_retrytopics_config_without_the_flag(
    app_module: Callable[..., str], started: list[RetryApp], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rt.toml").write_text('[kafka]\nclient_id = "from-file"\n')
    monkeypatch.setenv("RETRYTOPICS_CONFIG", str(tmp_path / "rt.toml"))
    assert cli.main(["run", app_module()]) == 0
    assert (started[0].kafka.bootstrap, started[0].kafka.client_id) == ("code-host:1", "from-file")


def test_the_app_module_is_found_in_the_working_directory(
    app_module: Callable[..., str], started: list[RetryApp], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = app_module()
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert cli.main(["run", reference]) == 0
    assert len(started) == 1


def test_metrics_without_the_extra_fails_before_loading_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    assert cli.main(["run", "no_such_module_anywhere:app", "--metrics-port", "9102"]) == 2
    err = capsys.readouterr().err
    assert "metrics.port=9102" in err and "pip install 'retrytopics[metrics]'" in err
    assert "no_such_module_anywhere" not in err, "the extra is checked before the app is imported"


def test_audit_chart_without_matplotlib_fails_before_the_spark_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import retrytopics.spark.audit as audit

    jobs: list[Any] = []
    monkeypatch.setattr(audit, "run_audit_cli", lambda *a, **k: jobs.append(a) or 0)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = [
        "audit",
        "--bootstrap",
        "127.0.0.1:1",
        "--topic",
        "orders",
        "--group",
        "billing",
        "--delays",
        "1s",
        "--chart",
        "audit.png",
    ]
    assert cli.main(argv) == 2
    assert jobs == []
    assert "pip install 'retrytopics[spark]'" in capsys.readouterr().err


def test_a_misspelt_toml_override_names_the_property_before_any_io(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rt.toml").write_text(
        '[kafka]\nbootstrap = "127.0.0.1:1"\n[kafka.overrides]\n"sockt.timeout.ms" = 100\n'
    )
    argv = [
        "topics",
        "create",
        "--config",
        str(tmp_path / "rt.toml"),
        "--topic",
        "orders",
        "--group",
        "billing",
        "--delays",
        "1s",
    ]
    assert cli.main(argv) == 2
    assert "configuration error: kafka.overrides[sockt.timeout.ms]=100" in capsys.readouterr().err


def test_an_app_override_librdkafka_refuses_stops_run_instead_of_waiting(
    app_module: Callable[..., str], started: list[RetryApp], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", app_module(consumer_overrides={"session.timeout.ms": "soon"})]) == 2
    assert started == []
    assert "consumer_overrides[session.timeout.ms]='soon'" in capsys.readouterr().err


def test_unreachable_cluster_hint_names_the_settings() -> None:
    assert preflight.connection_hint("UNKNOWN_TOPIC_OR_PART", None) is None
    plain = preflight.connection_hint("_TRANSPORT", None)
    assert plain is not None and "kafka.bootstrap" in plain and "kafka.ssl_ca_location" in plain
    tls = preflight.connection_hint(
        "_TRANSPORT", "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed"
    )
    assert tls is not None and "certificate verify failed" in tls and "kafka.ssl_ca_location" in tls


def test_pipeline_commands_take_topics_from_the_app_and_flags_override_it(
    app_module: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import retrytopics.operator.ops as ops

    seen: list[Any] = []
    monkeypatch.setattr(ops, "provision_pipeline", lambda kafka, app, **kw: seen.append((kafka, app)) or {})
    reference = app_module()
    assert cli.main(["topics", "create", "--app", reference]) == 0
    assert cli.main(["topics", "create", "--app", reference, "--delays", "2s,4s", "--bootstrap", "flag:1"]) == 0
    (kafka, own), (flagged_kafka, flagged) = seen
    assert kafka.bootstrap == "code-host:1" and flagged_kafka.bootstrap == "flag:1"
    assert list(ops.pipeline_topics(own).all_topics) == ["orders.billing.retry.1s", "orders.billing.dlq"]
    assert list(ops.pipeline_topics(flagged).all_topics[:2]) == ["orders.billing.retry.2s", "orders.billing.retry.4s"]


def test_a_pipeline_command_without_delays_says_where_to_give_them(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["topics", "describe", "--bootstrap", "127.0.0.1:1", "--topic", "orders", "--group", "billing"]
    assert cli.main(argv) == 2
    assert "configuration error: app.delays=None: required" in capsys.readouterr().err


def test_durations_and_times_are_spelled_the_same_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    describe = ["topics", "describe", "--topic", "t", "--group", "g", "--delays", "1s"]
    assert parser.parse_args([*describe, "--grace", "1m"]).grace == 60_000
    assert parser.parse_args(["demo", "--timeout", "90s"]).timeout == 90_000
    replay = parser.parse_args(
        ["replay", "--replay-id", "r", "--since", "2023-11-14T22:13:20Z", "--until", "1700000001000"]
    )
    assert (replay.since, replay.until) == (1_700_000_000_000, 1_700_000_001_000)
    with pytest.raises(SystemExit):
        parser.parse_args([*describe, "--grace", "30"])  # a bare number: seconds or milliseconds?
    assert "needs a unit" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"retrytopics {version('retrytopics')}"


def test_no_command_offers_a_flag_it_ignores() -> None:
    """Each option of each subcommand ends up in what the command reads: a settings layer or its own args."""
    settings_flags = {
        "config",
        "bootstrap",
        "log_level",
        "log_json",
        "metrics_port",
        "app",
        "topic",
        "group",
        "delays",
        "naming",
        "dlq",
    }
    parser = cli.build_parser()
    create = parser.parse_args(["topics", "create", "--topic", "t"])
    describe = parser.parse_args(["topics", "describe", "--topic", "t"])
    assert "partitions" in vars(create) and "partitions" not in vars(describe), "--partitions only where it is used"
    peek = parser.parse_args(["dlq", "peek"])
    assert set(vars(peek)) - settings_flags <= {"command", "action", "run", "dlq_topic", "last", "follow", "json"}


def test_a_tls_handshake_failure_reaches_the_hint() -> None:
    """A server that does not speak TLS stands in for a broker whose certificate the CA does not sign: the
    metadata request only says _TRANSPORT, the hint carries the handshake error an admin client saw."""
    import socket
    import threading

    from retrytopics.connectors.admin import partition_count
    from retrytopics.connectors.config import KafkaConfig
    from retrytopics.connectors.kafka import last_client_error, make_admin
    from retrytopics.core.errors import KafkaClientError

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def refuse_tls() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            connection.sendall(b"HTTP/1.0 400 not TLS\r\n\r\n")
            connection.close()

    thread = threading.Thread(target=refuse_tls, daemon=True)
    thread.start()
    try:
        kafka = KafkaConfig(bootstrap=f"127.0.0.1:{server.getsockname()[1]}", security_protocol="SSL")
        admin = make_admin(kafka)
        with pytest.raises(KafkaClientError) as info:
            partition_count(admin, "orders", timeout_s=2)
        # this cluster's error: a client of another test's (stopped) broker may report later in the process
        hint = preflight.connection_hint(info.value.code, last_client_error(kafka))
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    assert hint is not None and "TLS handshake failed" in hint and "kafka.ssl_ca_location" in hint


def test_a_metrics_port_in_use_is_a_configuration_error(
    app_module: Callable[..., str], started: list[RetryApp], capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        assert cli.main(["run", app_module(), "--metrics-port", str(port)]) == 2
    assert started == []
    assert f"configuration error: metrics.port={port}: cannot serve metrics" in capsys.readouterr().err
