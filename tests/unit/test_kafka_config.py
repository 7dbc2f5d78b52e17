"""KafkaConfig validates at construction and names the offending field; secrets never leak."""

from __future__ import annotations

import logging

import pytest

from retrytopics.connectors.config import KafkaConfig, redact
from retrytopics.core.errors import ConfigError


def _field_error(**kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        KafkaConfig(**kwargs)  # type: ignore[arg-type]
    return info.value


@pytest.mark.parametrize("bootstrap", ["", "  ", ",", "localhost", "host:notaport", "host:0", "host:70000"])
def test_bad_bootstrap_names_the_field(bootstrap: str) -> None:
    assert _field_error(bootstrap=bootstrap).field == "bootstrap"


def test_unknown_security_protocol_names_the_field() -> None:
    error = _field_error(bootstrap="h:1", security_protocol="TLS_PLEASE")
    assert error.field == "security_protocol"
    assert "SASL_SSL" in error.reason


def test_missing_sasl_password_names_the_field() -> None:
    error = _field_error(
        bootstrap="h:1", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="u"
    )
    assert error.field == "sasl_password"


def test_sasl_without_sasl_protocol_is_rejected() -> None:
    assert _field_error(bootstrap="h:1", sasl_username="u").field == "security_protocol"


def test_missing_tls_file_names_the_field(tmp_path) -> None:
    error = _field_error(bootstrap="h:1", security_protocol="SSL", ssl_ca_location=str(tmp_path / "nope.pem"))
    assert error.field == "ssl_ca_location"


@pytest.mark.parametrize("key", ["plugin.library.paths", "sasl.kerberos.kinit.cmd", "ssl.engine.location"])
def test_code_loading_overrides_are_refused(key: str) -> None:
    assert _field_error(bootstrap="h:1", overrides={key: "/tmp/evil.so"}).field == f"overrides[{key}]"


def test_disabling_tls_verification_needs_explicit_consent() -> None:
    key = "enable.ssl.certificate.verification"
    assert _field_error(bootstrap="h:1", overrides={key: "false"}).field == f"overrides[{key}]"
    config = KafkaConfig(bootstrap="h:1", overrides={key: "false"}, allow_insecure=True)
    assert config.client_config()[key] == "false"


def test_owned_properties_cannot_be_overridden() -> None:
    assert _field_error(bootstrap="h:1", producer_overrides={"bootstrap.servers": "x:1"}).field == (
        "producer_overrides[bootstrap.servers]"
    )


def test_java_property_names_are_explained() -> None:
    error = _field_error(bootstrap="h:1", overrides={"sasl.jaas.config": "x"})
    assert "librdkafka" in error.reason


def test_client_configs_layer_overrides() -> None:
    config = KafkaConfig(
        bootstrap="a:1,b:2",
        overrides={"socket.timeout.ms": 1000},
        producer_overrides={"linger.ms": 7},
        consumer_overrides={"fetch.min.bytes": 2},
    )
    assert config.producer_config()["linger.ms"] == 7 and "fetch.min.bytes" not in config.producer_config()
    assert config.consumer_config()["fetch.min.bytes"] == 2 and "linger.ms" not in config.consumer_config()
    assert config.client_config()["socket.timeout.ms"] == 1000
    more = config.with_overrides(producer={"acks": "all"})
    assert more.producer_config()["acks"] == "all" and more.producer_config()["linger.ms"] == 7


def test_secrets_never_appear_in_repr_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    sentinel = "s3ntinel-Pa55word"
    config = KafkaConfig(
        bootstrap="h:1",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password=sentinel,
        ssl_key_password=sentinel,
    )
    assert sentinel not in repr(config)
    assert sentinel not in str(redact(config.client_config()))
    with caplog.at_level(logging.DEBUG):
        from retrytopics.connectors.kafka import make_producer

        make_producer(config).flush(0)
    assert sentinel not in caplog.text


def test_from_env_reads_kafka_variables() -> None:
    config = KafkaConfig.from_env({"KAFKA_BOOTSTRAP_SERVERS": "x:9", "KAFKA_CLIENT_ID": "cid"})
    assert (config.bootstrap, config.client_id) == ("x:9", "cid")
    with pytest.raises(ConfigError) as info:
        KafkaConfig.from_env({})
    assert info.value.field == "bootstrap"


def test_sasl_mechanism_is_normalised_for_librdkafka() -> None:
    config = KafkaConfig(
        bootstrap="h:1", security_protocol="sasl_ssl", sasl_mechanism=" plain", sasl_username="u", sasl_password="p"
    )
    assert config.client_config()["sasl.mechanism"] == "PLAIN"
    assert config.client_config()["security.protocol"] == "SASL_SSL"


def test_ca_location_may_be_a_directory_but_certificates_are_files(tmp_path) -> None:
    assert KafkaConfig(bootstrap="h:1", security_protocol="SSL", ssl_ca_location=str(tmp_path)).ssl_ca_location == str(
        tmp_path
    )
    assert _field_error(bootstrap="h:1", security_protocol="SSL", ssl_certificate_location=str(tmp_path)).field == (
        "ssl_certificate_location"
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enable.ssl.certificate.verification", "0"),
        ("enable.ssl.certificate.verification", False),
        ("ssl.endpoint.identification.algorithm", "NONE"),
    ],
)
def test_every_spelling_of_turning_verification_off_is_refused(key: str, value: object) -> None:
    assert _field_error(bootstrap="h:1", consumer_overrides={key: value}).field == f"consumer_overrides[{key}]"


def test_override_values_must_be_scalars() -> None:
    error = _field_error(bootstrap="h:1", overrides={"socket.timeout.ms": {"ms": 1}})
    assert error.field == "overrides[socket.timeout.ms]" and "string, number or boolean" in error.reason


@pytest.mark.parametrize("factory", ["make_consumer", "make_producer", "make_admin"])
def test_client_factories_refuse_what_kafka_config_refuses(factory: str) -> None:
    """RetryApp's consumer_overrides/producer_overrides reach librdkafka through these factories."""
    from retrytopics.connectors import kafka as connectors

    make = getattr(connectors, factory)
    kwargs = {"group_id": "g"} if factory == "make_consumer" else {}
    for key, value in (("enable.ssl.certificate.verification", "false"), ("plugin.library.paths", "/tmp/x.so")):
        with pytest.raises(ConfigError) as info:
            make(KafkaConfig(bootstrap="h:1"), overrides={key: value}, **kwargs)
        assert info.value.field == f"overrides[{key}]"
    insecure = KafkaConfig(bootstrap="h:1", allow_insecure=True)
    make(insecure, overrides={"enable.ssl.certificate.verification": "false"}, **kwargs)


def test_check_properties_lets_librdkafka_name_the_bad_property() -> None:
    from retrytopics.connectors.kafka import check_properties

    check_properties("kafka.overrides", {"socket.timeout.ms": 30000, "linger.ms": 5})
    for properties, key in (
        ({"sockt.timeout.ms": 1}, "sockt.timeout.ms"),
        ({"socket.timeout.ms": "soon"}, "socket.timeout.ms"),
    ):
        with pytest.raises(ConfigError) as info:
            check_properties("kafka.overrides", properties)
        assert info.value.field == f"kafka.overrides[{key}]"
    with pytest.raises(ConfigError) as info:
        check_properties("kafka.producer_overrides", {"linger.ms": "later"}, producer=True)
    assert info.value.field == "kafka.producer_overrides[linger.ms]"


@pytest.mark.parametrize("option", ["consumer_overrides", "producer_overrides"])
def test_retry_app_overrides_cannot_turn_tls_verification_off(option: str) -> None:
    from retrytopics.app import RetryApp

    for key, value in (
        ("enable.ssl.certificate.verification", "false"),
        ("ssl.endpoint.identification.algorithm", "none"),
    ):
        with pytest.raises(ConfigError) as info:
            RetryApp(kafka=KafkaConfig(bootstrap="h:1"), group="g", **{option: {key: value}})
        assert info.value.field == f"{option}[{key}]"
    RetryApp(kafka=KafkaConfig(bootstrap="h:1", allow_insecure=True), group="g", **{option: {key: value}})


_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="hunter2-secret";'


@pytest.mark.parametrize(("key", "value"), [("sasl.jaas.config", _JAAS), ("java.sasl.password", "hunter2-secret")])
@pytest.mark.parametrize("field", ["overrides", "consumer_overrides", "producer_overrides"])
def test_a_refused_override_never_shows_a_secret_value(field: str, key: str, value: str) -> None:
    """A config error names the property but never prints the value of a secret-bearing key."""
    error = _field_error(bootstrap="h:1", **{field: {key: value}})
    assert error.field == f"{field}[{key}]" and "librdkafka" in error.reason
    assert "hunter2" not in str(error) and "hunter2" not in repr(error.value)


def test_the_old_name_of_bootstrap_servers_is_refused() -> None:
    """`metadata.broker.list` is librdkafka's alias of bootstrap.servers: set in overrides, it would
    silently replace the validated `bootstrap`."""
    for name in ("overrides", "producer_overrides", "consumer_overrides"):
        error = _field_error(bootstrap="h:1", **{name: {"metadata.broker.list": "evil:9092"}})
        assert error.field == f"{name}[metadata.broker.list]" and "evil" not in str(error)
