"""Guarantee: the replication factor and `min.insync.replicas` of provisioned topics can be given in the TOML
file, the environment and CLI flags; a bad value fails at start-up naming the field; and a tier or DLQ that
keeps fewer copies, or acknowledges with fewer, than its source is named in a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrytopics import RetryApp
from retrytopics.connectors.admin import TopicDurability, TopicSpec, less_durable, replication_config
from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import ConfigError
from retrytopics.operator.cli import build_parser
from retrytopics.operator.config import AppSettings, load_settings


def test_replication_comes_from_toml_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "rt.toml"
    path.write_text("[app]\nreplication_factor = 3\nmin_insync_replicas = 2\n")
    assert (
        load_settings(path=path, environ={}).app.min_insync_replicas,
        load_settings(path=path, environ={}).app.replication_factor,
    ) == (2, 3)
    environ = {"RETRYTOPICS_APP_MIN_INSYNC_REPLICAS": "3"}
    assert load_settings(path=path, environ=environ).app.min_insync_replicas == 3
    flags = {"app": {"replication_factor": 5, "min_insync_replicas": 4}}
    app = load_settings(path=path, environ=environ, flags=flags).app
    assert (app.replication_factor, app.min_insync_replicas) == (5, 4)
    assert AppSettings() == AppSettings(replication_factor=-1, min_insync_replicas=None)  # the broker's defaults


@pytest.mark.parametrize(
    ("environ", "field"),
    [
        ({"RETRYTOPICS_APP_REPLICATION_FACTOR": "0"}, "app.replication_factor"),
        ({"RETRYTOPICS_APP_REPLICATION_FACTOR": "-2"}, "app.replication_factor"),
        ({"RETRYTOPICS_APP_REPLICATION_FACTOR": "three"}, "app.replication_factor"),
        ({"RETRYTOPICS_APP_MIN_INSYNC_REPLICAS": "0"}, "app.min_insync_replicas"),
        (
            {"RETRYTOPICS_APP_REPLICATION_FACTOR": "2", "RETRYTOPICS_APP_MIN_INSYNC_REPLICAS": "3"},
            "app.min_insync_replicas",
        ),
    ],
)
def test_a_bad_replication_setting_names_its_field(environ: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(environ=environ)
    assert refused.value.field == field


def test_the_cli_flags_reach_the_settings() -> None:
    args = build_parser().parse_args(
        ["topics", "create", "--topic", "t", "--replication-factor", "3", "--min-insync-replicas", "2"]
    )
    assert (args.replication_factor, args.min_insync_replicas) == (3, 2)
    from retrytopics.operator.cli import _settings

    args.config = None
    app = _settings(args).app
    assert (app.replication_factor, app.min_insync_replicas) == (3, 2)


def test_topic_specs_carry_min_insync_replicas_and_refuse_impossible_ones() -> None:
    spec = TopicSpec(name="t", replication_factor=3, config=replication_config(2))
    assert dict(spec.config) == {"min.insync.replicas": "2"}
    assert replication_config(None) == {}
    with pytest.raises(ConfigError) as refused:
        TopicSpec(name="t", replication_factor=2, config=replication_config(3))
    assert refused.value.field == "t.min_insync_replicas"
    with pytest.raises(ConfigError, match="replication_factor"):
        TopicSpec(name="t", replication_factor=0)


def test_provision_refuses_bad_replication_before_any_io() -> None:
    app = RetryApp(kafka=KafkaConfig(bootstrap="127.0.0.1:1"), group="g")
    app.handler("orders")(lambda record: None)
    for kwargs, field in (
        ({"replication_factor": 0}, "provision.replication_factor"),
        ({"replication_factor": 1, "min_insync_replicas": 2}, "provision.min_insync_replicas"),
    ):
        with pytest.raises(ConfigError) as refused:
            app.provision(partitions=1, timeout="1s", **kwargs)  # type: ignore[arg-type]
        assert refused.value.field == field


def test_a_tier_or_dlq_less_durable_than_its_source_is_named() -> None:
    strong, weak_copies, weak_acks = (
        TopicDurability(replication_factor=r, min_insync_replicas=m) for r, m in ((3, 2), (1, 1), (3, 1))
    )
    warnings = less_durable(
        "orders", {"orders": strong, "orders.retry.1s": weak_copies, "orders.dlq": weak_acks, "orders.retry.5s": strong}
    )
    assert len(warnings) == 3
    assert "orders.retry.1s has replication factor 1, less than its source orders (3)" in warnings[0]
    assert "orders.retry.1s has min.insync.replicas=1" in warnings[1]
    assert "orders.dlq has min.insync.replicas=1, less than its source orders (2)" in warnings[2]
    assert less_durable("orders", {"orders": weak_copies, "orders.dlq": strong}) == []  # more durable is fine
    assert less_durable("orders", {"orders.dlq": weak_copies}) == []  # source unknown: nothing to compare
    # a broker that does not report min.insync.replicas (tansu): only the replicas are compared
    unknown = TopicDurability(replication_factor=3, min_insync_replicas=None)
    assert less_durable("orders", {"orders": strong, "orders.dlq": unknown}) == []
    assert less_durable("orders", {"orders": unknown, "orders.dlq": weak_acks}) == []
