"""docker-compose.yml cannot run here (no Docker engine), so its contract is checked instead: every
service command is a real `retrytopics` command with valid options, the app it names is a RetryApp, its
settings file loads, every tier of that app has a service, and Kafka runs in KRaft mode."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from retrytopics.app import RetryApp
from retrytopics.cli import build_parser
from retrytopics.config import load_settings
from retrytopics.durations import parse_duration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _retrytopics_services(compose: dict[str, Any]) -> dict[str, list[str]]:
    commands = {name: s["command"] for name, s in compose["services"].items() if "command" in s}
    assert commands, "no service runs a command"
    for name, command in commands.items():
        assert isinstance(command, list) and command[0] == "retrytopics", f"{name}: {command!r}"
    return commands


def test_every_command_parses_with_the_real_cli(compose: dict[str, Any]) -> None:
    parser = build_parser()
    for name, command in _retrytopics_services(compose).items():
        try:
            args = parser.parse_args(command[1:])
        except SystemExit as exc:  # argparse exits on unknown commands or options
            pytest.fail(f"service {name}: `{' '.join(command)}` is not a valid command ({exc})")
        assert callable(args.run), name


@pytest.fixture
def example_app(monkeypatch: pytest.MonkeyPatch) -> RetryApp:
    monkeypatch.setenv("RETRYTOPICS_CONFIG", str(ROOT / "examples" / "retrytopics.toml"))
    monkeypatch.syspath_prepend(str(ROOT))
    module = importlib.reload(importlib.import_module("examples.billing"))
    return module.app


def test_apps_named_by_services_are_retry_apps(compose: dict[str, Any], example_app: RetryApp) -> None:
    parser = build_parser()
    for name, command in _retrytopics_services(compose).items():
        args = parser.parse_args(command[1:])
        if getattr(args, "app", None):
            module, _, attribute = args.app.partition(":")
            assert isinstance(getattr(importlib.import_module(module), attribute), RetryApp), name


def test_every_tier_has_a_service(compose: dict[str, Any], example_app: RetryApp) -> None:
    parser = build_parser()
    served = set()
    for command in _retrytopics_services(compose).values():
        args = parser.parse_args(command[1:])
        if args.command == "tiers":
            served |= {parse_duration(t, field="tier") for t in (args.tier or [])}
    (binding,) = example_app.handlers.values()
    assert served == set(binding.policy.tier_delays_ms)


def test_settings_file_of_the_services_loads(compose: dict[str, Any]) -> None:
    settings = load_settings(path=ROOT / "examples" / "retrytopics.toml", environ={})
    assert settings.kafka is not None and settings.kafka.bootstrap == "kafka:9092"
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_spark_job_uses_the_builtin_connector_matching_the_image(compose: dict[str, Any]) -> None:
    audit = compose["services"]["audit"]
    version = compose["x-retrytopics"]["build"]["args"]["SPARK_VERSION"]
    assert "--kafka-format" in audit["command"] and "builtin" in audit["command"]
    assert f"spark-sql-kafka-0-10_2.13:{version}" in audit["environment"]["PYSPARK_SUBMIT_ARGS"]
    assert os.path.exists(ROOT / "Dockerfile")


def _listeners(text: str) -> dict[str, tuple[str, int]]:
    """`NAME://host:port,...` → {NAME: (host, port)}."""
    found = {}
    for entry in text.split(","):
        name, _, address = entry.partition("://")
        host, _, port = address.rpartition(":")
        found[name] = (host, int(port))
    return found


def test_each_client_is_advertised_an_address_it_can_resolve(compose: dict[str, Any]) -> None:
    """A client bootstraps, then connects to the *advertised* address of that listener: the host must be
    told localhost:<published port>, containers the service name."""
    kafka = compose["services"]["kafka"]
    bound = {port: name for name, (_, port) in _listeners(kafka["environment"]["KAFKA_LISTENERS"]).items()}
    advertised = _listeners(kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"])
    for mapping in kafka["ports"]:
        host_port, _, container_port = str(mapping).partition(":")
        listener = bound[int(container_port)]
        assert advertised[listener] == ("localhost", int(host_port)), f"published {mapping} advertises {advertised[listener]}"
    internal = compose["x-retrytopics"]["environment"]["KAFKA_BOOTSTRAP_SERVERS"]
    host, _, port = internal.rpartition(":")
    assert host == "kafka" and advertised[bound[int(port)]] == (host, int(port)), "services bootstrap on their own listener"
