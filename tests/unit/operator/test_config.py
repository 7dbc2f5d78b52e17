"""Operator settings: layers merge in order, and every error names the dotted field and its origin."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrytopics.core.errors import ConfigError
from retrytopics.core.naming import NamingStrategy
from retrytopics.operator.config import load_settings

TOML = """
[kafka]
bootstrap = "file-host:9092"
client_id = "from-file"
[kafka.overrides]
"socket.timeout.ms" = 30000
[app]
topic = "orders"
group = "billing"
delays = ["1s", "10s"]
[metrics]
port = 9102
"""


def _error(**kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_settings(**kwargs)  # type: ignore[arg-type]
    return info.value


def test_layers_merge_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "rt.toml"
    path.write_text(TOML)
    settings = load_settings(
        path=path,
        environ={"RETRYTOPICS_KAFKA_CLIENT_ID": "from-env", "RETRYTOPICS_APP_GROUP": "env-group"},
        flags={"app": {"group": "flag-group", "topic": None}},
    )
    assert settings.kafka is not None
    assert (settings.kafka.bootstrap, settings.kafka.client_id) == ("file-host:9092", "from-env")
    assert settings.kafka.client_config()["socket.timeout.ms"] == 30000
    assert (settings.app.topic, settings.app.group, settings.app.delays) == ("orders", "flag-group", ("1s", "10s"))
    assert settings.metrics_port == 9102
    assert settings.app.naming is NamingStrategy.BY_DELAY


def test_kafka_bootstrap_servers_is_a_fallback() -> None:
    settings = load_settings(environ={"KAFKA_BOOTSTRAP_SERVERS": "env-host:1"})
    assert settings.kafka is not None and settings.kafka.bootstrap == "env-host:1"
    assert load_settings(environ={}).kafka is None


def test_unknown_key_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "rt.toml"
    path.write_text('[app]\ndelay = ["5s"]\n')
    error = _error(path=path, environ={})
    assert error.field == "app.delay"
    assert "delays" in error.reason and str(path) in error.reason


def test_bad_values_name_the_field() -> None:
    assert _error(environ={"RETRYTOPICS_METRICS_PORT": "ninety"}).field == "metrics.port"
    assert _error(environ={}, flags={"app": {"delays": ["5s", "7"]}}).field == "app.delays[1]"
    assert _error(environ={}, flags={"app": {"naming": "fancy"}}).field == "app.naming"
    assert _error(environ={}, flags={"logging": {"level": "LOUD"}}).field == "logging.level"
    assert _error(environ={"RETRYTOPICS_KAFKA_BOOTSTRAP": "nohost"}).field == "kafka.bootstrap"
    assert _error(environ={}, flags={"app": {"topic": "bad topic!"}}).field == "app.topic"


def test_kafka_errors_are_prefixed_with_their_section() -> None:
    error = _error(environ={"RETRYTOPICS_KAFKA_BOOTSTRAP": "h:1", "RETRYTOPICS_KAFKA_SECURITY_PROTOCOL": "NOPE"})
    assert error.field == "kafka.security_protocol"


def test_secrets_come_from_env_or_file_never_argv(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    env = {
        "RETRYTOPICS_KAFKA_BOOTSTRAP": "h:1",
        "RETRYTOPICS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "RETRYTOPICS_KAFKA_SASL_MECHANISM": "PLAIN",
        "RETRYTOPICS_KAFKA_SASL_USERNAME": "u",
        "RETRYTOPICS_KAFKA_SASL_PASSWORD_FILE": str(secret),
    }
    settings = load_settings(environ=env)
    assert settings.kafka is not None and settings.kafka.sasl_password == "s3cret"
    assert "s3cret" not in repr(settings)
    error = _error(environ=env, flags={"kafka": {"sasl_password": "leaky"}})
    assert error.field == "kafka.sasl_password" and "leaky" not in str(error)


def test_missing_required_settings_name_the_field() -> None:
    settings = load_settings(environ={})
    with pytest.raises(ConfigError) as info:
        settings.require_kafka()
    assert info.value.field == "kafka.bootstrap"
    with pytest.raises(ConfigError) as info:
        settings.app.require("group")
    assert info.value.field == "app.group"


def test_invalid_toml_is_reported_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[kafka\n")
    error = _error(path=path, environ={})
    assert error.field == "config" and "TOML" in error.reason


@pytest.mark.parametrize("text", ["--5", "+-5", "5-", "²", ""])
def test_malformed_integers_are_config_errors_from_every_layer(text: str, tmp_path: Path) -> None:
    assert _error(environ={"RETRYTOPICS_APP_PARTITIONS": text}).field == "app.partitions"
    path = tmp_path / "rt.toml"
    path.write_text(f'[app]\npartitions = "{text}"\n')
    assert _error(path=path, environ={}).field == "app.partitions"


def test_a_password_file_that_is_not_utf8_names_the_field_and_hides_its_bytes(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_bytes(b"s3cr\xff\xfeet")
    env = {
        "RETRYTOPICS_KAFKA_BOOTSTRAP": "h:1",
        "RETRYTOPICS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "RETRYTOPICS_KAFKA_SASL_MECHANISM": "PLAIN",
        "RETRYTOPICS_KAFKA_SASL_USERNAME": "u",
        "RETRYTOPICS_KAFKA_SASL_PASSWORD_FILE": str(secret),
    }
    error = _error(environ=env)
    assert error.field == "kafka.sasl_password_file" and "UTF-8" in error.reason
    assert "s3cr" not in str(error)


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_metrics_port_out_of_range_fails_at_load(port: str, tmp_path: Path) -> None:
    assert _error(environ={"RETRYTOPICS_METRICS_PORT": port}).field == "metrics.port"
    path = tmp_path / "rt.toml"
    path.write_text(f"[metrics]\nport = {port}\n")
    assert _error(path=path, environ={}).field == "metrics.port"


def test_retrytopics_config_names_the_file_when_no_path_is_given(tmp_path: Path) -> None:
    path = tmp_path / "rt.toml"
    path.write_text(TOML)
    settings = load_settings(environ={"RETRYTOPICS_CONFIG": str(path)})
    assert settings.kafka is not None and settings.kafka.bootstrap == "file-host:9092"


def test_kafka_settings_apply_over_an_apps_own_config_field_by_field(tmp_path: Path) -> None:
    from retrytopics.connectors.config import KafkaConfig

    own = KafkaConfig(bootstrap="code:1", client_id="code", overrides={"socket.timeout.ms": 1, "linger.ms": 2})
    path = tmp_path / "rt.toml"
    path.write_text('[kafka]\nclient_id = "file"\n[kafka.overrides]\n"socket.timeout.ms" = 30000\n')
    settings = load_settings(path=path, environ={}, flags={"kafka": {"bootstrap": None}})
    assert settings.kafka is None, "no bootstrap anywhere: the app's own applies"
    merged = settings.kafka_over(own)
    assert (merged.bootstrap, merged.client_id) == ("code:1", "file")
    assert dict(merged.overrides) == {"socket.timeout.ms": 30000, "linger.ms": 2}
    flagged = load_settings(
        path=path, environ={"RETRYTOPICS_KAFKA_BOOTSTRAP": "env:1"}, flags={"kafka": {"bootstrap": "flag:1"}}
    )
    assert flagged.kafka_over(own).bootstrap == "flag:1"
    insecure = load_settings(environ={"RETRYTOPICS_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    with pytest.raises(ConfigError) as info:
        insecure.kafka_over(own)
    assert info.value.field == "kafka.sasl_mechanism"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1700000000000", 1_700_000_000_000),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000),
        ("2023-11-14T23:13:20.5+01:00", 1_700_000_000_500),
        ("2023-11-14", 1_699_920_000_000),
    ],
)
def test_instants_are_epoch_ms_or_iso_8601(text: str, expected: int) -> None:
    from retrytopics.operator.config import parse_instant

    assert parse_instant(text, field="--since") == expected


@pytest.mark.parametrize("text", ["yesterday", "2023-11-14T22:13:20", "1.5e12"])
def test_unreadable_or_zoneless_instants_name_the_flag(text: str) -> None:
    from retrytopics.operator.config import parse_instant

    with pytest.raises(ConfigError) as info:
        parse_instant(text, field="--since")
    assert info.value.field == "--since"


def test_delays_have_no_silent_default() -> None:
    settings = load_settings(environ={}, flags={"app": {"topic": "orders", "group": "billing"}})
    assert settings.app.delays is None
    from retrytopics.operator.ops import pipeline_topics

    with pytest.raises(ConfigError) as info:
        pipeline_topics(settings.app)
    assert info.value.field == "app.delays" and "--app" in info.value.reason


def test_the_main_consumer_model_comes_from_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`[app] consumer = "share"` makes `retrytopics run`'s app a share-group consumer; on an exactly-once app
    it is refused naming `exactly_once`, and an unknown model names `app.consumer`."""
    from retrytopics.operator.preflight import prepare_app

    (tmp_path / "share_cfg_apps.py").write_text(
        "from retrytopics import KafkaConfig, RetryApp\n"
        "plain = RetryApp(kafka=KafkaConfig(bootstrap='127.0.0.1:9'), group='billing')\n"
        "eos = RetryApp(kafka=KafkaConfig(bootstrap='127.0.0.1:9'), group='billing', exactly_once=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "rt.toml"
    path.write_text('[app]\nconsumer = "share"\n')
    settings = load_settings(path=path, environ={})
    assert settings.app.consumer == "share"
    assert prepare_app("share_cfg_apps:plain", settings).consumer == "share"
    with pytest.raises(ConfigError) as refused:
        prepare_app("share_cfg_apps:eos", settings)
    assert refused.value.field == "exactly_once"
    assert _error(environ={"RETRYTOPICS_APP_CONSUMER": "queue"}).field == "app.consumer"


def test_handler_concurrency_comes_from_the_config_file_the_environment_or_a_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[app] concurrency = 200` (or RETRYTOPICS_APP_CONCURRENCY, or `run --concurrency`) sets the calls in flight
    of `[app] topic`'s handler, else of every handler (a key-ordered one too); a bad value names
    `app.concurrency`."""
    from retrytopics.operator.preflight import prepare_app

    (tmp_path / "window_cfg_apps.py").write_text(
        "from retrytopics import KafkaConfig, KeyOrdering, RetryApp\n"
        "app = RetryApp(kafka=KafkaConfig(bootstrap='127.0.0.1:9'), group='billing')\n"
        "app.handler('orders')(lambda record: None)\n"
        "app.handler('refunds')(lambda record: None)\n"
        "ordered = RetryApp(kafka=KafkaConfig(bootstrap='127.0.0.1:9'), group='billing')\n"
        "ordered.handler('orders', ordering=KeyOrdering())(lambda record: None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "rt.toml"
    path.write_text("[app]\nconcurrency = 200\n")
    app = prepare_app("window_cfg_apps:app", load_settings(path=path, environ={}))
    assert {t: b.concurrency and b.concurrency.calls for t, b in app.handlers.items()} == {
        "orders": 200,
        "refunds": 200,
    }
    one = load_settings(environ={"RETRYTOPICS_APP_CONCURRENCY": "8"}, flags={"app": {"topic": "refunds"}})
    assert one.app.concurrency == 8
    flagged = load_settings(path=path, environ={}, flags={"app": {"concurrency": 1, "topic": "orders"}})
    app = prepare_app("window_cfg_apps:app", flagged)
    assert app.handlers["orders"].concurrency is None  # 1: one call at a time, as before
    assert _error(environ={"RETRYTOPICS_APP_CONCURRENCY": "0"}).field == "app.concurrency"
    ordered = prepare_app("window_cfg_apps:ordered", load_settings(path=path, environ={}))
    keyed = ordered.handlers["orders"]
    assert keyed.ordering is not None and keyed.concurrency is not None and keyed.concurrency.calls == 200
