"""docker-compose.yml cannot run here (no Docker engine), so its contract is checked instead.

The file is validated against the Compose Specification's own JSON schema (`data/compose-spec.json`,
`schema/compose-spec.json` of the compose-spec/compose-spec repository at commit 170098ba07d9, June 2026),
with `jsonschema`: Docker Compose itself validates every file against that schema before anything else
(compose-go loads it), so this is the parser's own first step, run without Docker. Compose's interpolation
and merge rules are not exercised: the file uses no `${...}` and only YAML merge keys, which PyYAML applies.

On top of the schema: every service command is a real `retrytopics` command, the app it names is a
RetryApp whose every tier has its own service, the three KRaft brokers' listeners and advertised addresses
agree, tier and DLQ topics get three replicas with min.insync.replicas=2, every dependency exists and can
be met, Prometheus scrapes every metrics port, and the Spark version is pinned once."""

from __future__ import annotations

import base64
import copy
import importlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from retrytopics.app import RetryApp
from retrytopics.core.durations import parse_duration
from retrytopics.operator.cli import build_parser
from retrytopics.operator.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = Path(__file__).resolve().parent / "data" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def prometheus() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())


def _schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    return [f"{error.json_path}: {error.message}" for error in validator.iter_errors(document)]


def test_the_file_is_valid_compose(compose: dict[str, Any]) -> None:
    assert _schema_errors(compose) == []
    # the same validator refuses what compose refuses: misspelt keys of a service and of a volume
    broken = copy.deepcopy(compose)
    broken["services"]["billing"]["dependson"] = ["kafka-1"]
    broken["volumes"]["kafka-1"] = {"drivr": "local"}
    assert len(_schema_errors(broken)) == 2


def _retrytopics_services(compose: dict[str, Any]) -> dict[str, list[str]]:
    commands = {
        name: s["command"]
        for name, s in compose["services"].items()
        if str(s.get("image", "")).startswith("retrytopics")
    }
    assert commands, "no service runs retrytopics"
    for name, command in commands.items():
        assert isinstance(command, list) and command[0] == "retrytopics", f"{name}: {command!r}"
    return commands


def _brokers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if str(s.get("image", "")).startswith("apache/kafka:")}


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


def test_every_tier_has_a_service_of_its_own(compose: dict[str, Any], example_app: RetryApp) -> None:
    """One tier per service, so each scales on its own (`--scale tier-30s=3`)."""
    parser = build_parser()
    served: list[int] = []
    for name, command in _retrytopics_services(compose).items():
        args = parser.parse_args(command[1:])
        if args.command == "tiers":
            assert args.tier and len(args.tier) == 1, f"{name} runs {args.tier or 'every tier'}, not one"
            served.append(parse_duration(args.tier[0], field="tier"))
    (binding,) = example_app.handlers.values()
    assert sorted(served) == sorted(binding.policy.tier_delays_ms)


def _listeners(text: str) -> dict[str, tuple[str, int]]:
    """`NAME://host:port,...` → {NAME: (host, port)}."""
    found = {}
    for entry in text.split(","):
        name, _, address = entry.partition("://")
        host, _, port = address.rpartition(":")
        found[name] = (host, int(port))
    return found


def test_kafka_is_three_kraft_nodes_with_three_replicas_and_two_in_sync(compose: dict[str, Any]) -> None:
    brokers = _brokers(compose)
    assert len(brokers) == 3
    envs = {name: b["environment"] for name, b in brokers.items()}
    for name, broker in brokers.items():
        assert re.fullmatch(r"apache/kafka:4\.1\.\d+", broker["image"]), name
    ids = {name: int(env["KAFKA_NODE_ID"]) for name, env in envs.items()}
    assert sorted(ids.values()) == [1, 2, 3]
    (cluster_id,) = {env["CLUSTER_ID"] for env in envs.values()}  # one cluster
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    for name, env in envs.items():
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, name
        controller = _listeners(env["KAFKA_LISTENERS"])[env["KAFKA_CONTROLLER_LISTENER_NAMES"]]
        voters = {v.partition("@")[0]: v.partition("@")[2] for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")}
        assert voters == {str(i): f"{n}:{controller[1]}" for n, i in ids.items()}, f"{name}: voters {voters}"
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3" and env["KAFKA_MIN_INSYNC_REPLICAS"] == "2", name
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3", name
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2", name
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false", name


def test_services_provision_three_replicas_on_every_broker(compose: dict[str, Any]) -> None:
    """What the services read (the TOML file, then their environment) names all three brokers' internal
    listeners, and three replicas with two in sync for the topics `topics create` makes, as for the source."""
    brokers = _brokers(compose)
    for name, service in compose["services"].items():
        if name not in _retrytopics_services(compose):
            continue
        assert "./examples/retrytopics.toml:/etc/retrytopics/retrytopics.toml:ro" in service["volumes"], name
        environ = {k: str(v) for k, v in service["environment"].items() if k != "RETRYTOPICS_CONFIG"}
        settings = load_settings(path=ROOT / "examples" / "retrytopics.toml", environ=environ)
        assert settings.kafka is not None
        assert sorted(settings.kafka.bootstrap.split(",")) == sorted(f"{b}:9092" for b in brokers), name
        assert settings.app.replication_factor == 3, name
        assert settings.app.min_insync_replicas == 2, name


def _published(mapping: str | int) -> tuple[range, int]:
    """A short-syntax port (`"9201-9203:9102"`, `"19092:19092"`) → (host ports, container port)."""
    host, _, container = str(mapping).rpartition(":")
    first, _, last = host.rpartition(":")[2].partition("-")
    return range(int(first), int(last or first) + 1), int(container)


def test_listeners_and_advertised_addresses_agree(compose: dict[str, Any]) -> None:
    """A client bootstraps, then connects to the *advertised* address of the listener it reached: the host
    must be told localhost:<published port>, containers the broker's service name."""
    brokers = _brokers(compose)
    for name, broker in brokers.items():
        env = broker["environment"]
        bound = _listeners(env["KAFKA_LISTENERS"])
        advertised = _listeners(env["KAFKA_ADVERTISED_LISTENERS"])
        protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert set(bound) == set(protocols), f"{name}: every listener needs a security protocol"
        assert set(advertised) == set(bound) - {env["KAFKA_CONTROLLER_LISTENER_NAMES"]}, name
        for listener, (_, port) in advertised.items():
            assert bound[listener][1] == port, f"{name}: {listener} advertises {port}, binds {bound[listener][1]}"
        assert advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]] == (name, 9092), name
        published = [_published(p) for p in broker["ports"]]
        assert published, f"{name}: not reachable from the host"
        for hosts, container in published:
            (listener,) = [n for n, (_, port) in bound.items() if port == container]
            assert advertised[listener] == ("localhost", hosts.start) and len(hosts) == 1, name


def test_every_dependency_exists_and_can_be_met(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for target, condition in service.get("depends_on", {}).items():
            assert target in services, f"{name} depends on a service that does not exist: {target}"
            assert "profiles" not in services[target], f"{name} depends on {target}, which `up` does not start"
            if condition["condition"] == "service_healthy":
                assert not services[target].get("healthcheck", {}).get("disable"), f"{target} has no healthcheck"
                assert "test" in services[target]["healthcheck"], f"{target} has no healthcheck"
            if condition["condition"] == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} would be restarted, never complete"
        if service.get("restart") == "unless-stopped":
            assert "test" in service.get("healthcheck", {}), f"long-running {name} has no healthcheck"


def _metrics_ports(compose: dict[str, Any]) -> dict[str, int]:
    parser = build_parser()
    ports = {}
    for name, command in _retrytopics_services(compose).items():
        port = getattr(parser.parse_args(command[1:]), "metrics_port", None)
        if port is not None:
            ports[name] = port
    return ports


def test_every_metrics_port_is_published_for_each_replica(compose: dict[str, Any]) -> None:
    ports = _metrics_ports(compose)
    assert set(ports) == {"billing", "tier-5s", "tier-30s", "tier-5m"}
    taken: dict[int, str] = {}
    for name, service in compose["services"].items():
        for hosts, container in (_published(p) for p in service.get("ports", [])):
            for port in hosts:
                assert port not in taken, f"host port {port} published by {taken[port]} and {name}"
                taken[port] = name
            if name in ports:
                assert container == ports[name], f"{name} publishes {container}, serves {ports[name]}"
                replicas = service.get("deploy", {}).get("replicas", 1)
                assert len(hosts) >= max(replicas, 3), f"{name}: {len(hosts)} host ports for up to 3 replicas"
    assert set(ports) <= set(taken.values())


def test_prometheus_scrapes_every_metrics_port(compose: dict[str, Any], prometheus: dict[str, Any]) -> None:
    server = compose["services"]["prometheus"]
    config_file = next(a.partition("=")[2] for a in server["command"] if a.startswith("--config.file="))
    assert f"./deploy/prometheus.yml:{config_file}:ro" in server["volumes"]
    scraped: set[tuple[str, int]] = set()
    for job in prometheus["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):  # one A lookup answers every replica of a service
            assert sd["type"] == "A"
            scraped |= {(name, int(sd["port"])) for name in sd["names"]}
        for static in job.get("static_configs", []):
            scraped |= {(t.rpartition(":")[0], int(t.rpartition(":")[2])) for t in static["targets"]}
    expected = {(name, port) for name, port in _metrics_ports(compose).items()}
    assert expected <= scraped
    stale = {name for name, _ in scraped} - set(compose["services"]) - {"localhost"}
    assert not stale, f"scrape jobs for services that do not exist: {stale}"


def _spark_pin() -> str:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    (pin,) = [d.partition("==")[2] for d in extra if d.startswith("pyspark==")]
    return pin


def test_spark_is_pinned_once(compose: dict[str, Any]) -> None:
    """pip refuses two different pins of pyspark (the image's build arg and the spark extra), and
    --packages must fetch the connector of exactly that Spark."""
    pin = _spark_pin()
    assert compose["x-retrytopics"]["build"]["args"]["SPARK_VERSION"] == pin
    assert re.search(rf"^ARG SPARK_VERSION={re.escape(pin)}$", (ROOT / "Dockerfile").read_text(), re.M)
    for job in ("audit", "replay"):
        service = compose["services"][job]
        assert service["profiles"] == ["jobs"], job
        assert service["command"][:2] == ["retrytopics", job], job
        assert service["command"][service["command"].index("--kafka-format") + 1] == "builtin", job
        assert f"spark-sql-kafka-0-10_2.13:{pin} " in service["environment"]["PYSPARK_SUBMIT_ARGS"], job
