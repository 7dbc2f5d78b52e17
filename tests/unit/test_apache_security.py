"""`BrokerSecurity` (connectors/apache_security.py): what it makes the local Apache Kafka broker enforce, and
that its passwords stay out of reprs and errors. The broker itself runs in tests/integration/security/."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrytopics.connectors.apache import ApacheKafkaBroker
from retrytopics.connectors.apache_security import AUTHORIZER, BrokerSecurity
from retrytopics.core.errors import ConfigError

USERS = {"admin": "admin-Secret-1", "billing": "billing-Secret-2"}


def _security(tmp_path: Path, **changes: object) -> BrokerSecurity:
    for name in ("broker.pem", "ca.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    fields: dict[str, object] = {
        "keystore": tmp_path / "broker.pem",
        "truststore": tmp_path / "ca.pem",
        "users": USERS,
        "admin": "admin",
        "key_password": "key-Secret-3",
        **changes,
    }
    return BrokerSecurity(**fields)  # type: ignore[arg-type]


def test_listeners_get_scram_over_tls_and_the_authorizer_denies_by_default(tmp_path: Path) -> None:
    properties = _security(tmp_path).server_properties(("SASL_SSL", "INTERNAL"))

    assert properties["authorizer.class.name"] == AUTHORIZER
    assert properties["allow.everyone.if.no.acl.found"] == "false"
    # the broker's own principal and the PLAINTEXT controller listener's; no one else
    assert properties["super.users"] == "User:admin;User:ANONYMOUS"
    assert (
        properties["sasl.enabled.mechanisms"] == properties["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    )
    assert properties["ssl.keystore.type"] == properties["ssl.truststore.type"] == "PEM"
    assert properties["ssl.key.password"] == "key-Secret-3"
    jaas = {k: v for k, v in properties.items() if k.endswith(".sasl.jaas.config")}
    assert sorted(jaas) == [
        "listener.name.internal.scram-sha-512.sasl.jaas.config",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config",
    ]
    assert all('username="admin" password="admin-Secret-1";' in v for v in jaas.values())
    assert "ssl.key.password" not in _security(tmp_path, key_password=None).server_properties(("SASL_SSL",))


def test_every_user_is_created_at_format_time_and_clients_get_kafka_config_fields(tmp_path: Path) -> None:
    security = _security(tmp_path)

    assert security.format_arguments() == [
        "--add-scram",
        "SCRAM-SHA-512=[name=admin,password=admin-Secret-1]",
        "--add-scram",
        "SCRAM-SHA-512=[name=billing,password=billing-Secret-2]",
    ]
    assert security.client_fields("billing") == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "billing",
        "sasl_password": "billing-Secret-2",
        "ssl_ca_location": str(tmp_path / "ca.pem"),
    }
    with pytest.raises(ConfigError, match="not a SCRAM user"):
        security.client_fields("mallory")


def test_passwords_stay_out_of_repr_and_errors(tmp_path: Path) -> None:
    assert not [s for s in (*USERS.values(), "key-Secret-3") if s in repr(_security(tmp_path))]
    # a comma or bracket would split StorageTool's [name=...,password=...] argument
    for bad in ("pass,word-Secret", "pass]word-Secret", 'pass"word-Secret', ""):
        with pytest.raises(ConfigError) as refused:
            _security(tmp_path, users={**USERS, "billing": bad})
        assert bad == "" or bad not in str(refused.value)
    with pytest.raises(ConfigError, match="admin"):
        _security(tmp_path, admin="root")
    with pytest.raises(ConfigError, match="keystore"):
        _security(tmp_path, keystore=tmp_path / "missing.pem")


def test_a_secured_broker_names_its_listener_for_the_protocol_and_connects_as_its_super_user(tmp_path: Path) -> None:
    broker = ApacheKafkaBroker(security=_security(tmp_path), port=19092)
    plain = ApacheKafkaBroker(port=19093)
    try:
        assert broker.listener == "SASL_SSL" and plain.listener == "PLAINTEXT"
        assert (
            broker.settings["listener.security.protocol.map"]
            == "SASL_SSL:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT"
        )
        assert "authorizer.class.name" not in plain.settings
        kafka = broker.kafka_config()
        assert (str(kafka.security_protocol), kafka.sasl_username) == ("SASL_SSL", "admin")
        assert broker.kafka_config(**_security(tmp_path).client_fields("billing")).sasl_username == "billing"
        assert str(plain.kafka_config().security_protocol) == "PLAINTEXT"
    finally:
        broker.stop()
        plain.stop()
