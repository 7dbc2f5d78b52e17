"""One validated Kafka connection model, shared by every client retrytopics creates.

Pure: no confluent-kafka import here, so the config can be built and validated anywhere (CLI, Spark driver,
tests). `KafkaConfig.client_config()` renders librdkafka properties; secrets never appear in `repr`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from retrytopics.core.errors import ConfigError

__all__ = [
    "FORBIDDEN_OVERRIDES",
    "KafkaConfig",
    "SecurityProtocol",
    "check_replication",
    "redact",
    "validate_overrides",
]


class SecurityProtocol(StrEnum):
    """How clients talk to the brokers (librdkafka's `security.protocol`)."""

    PLAINTEXT = "PLAINTEXT"
    """No encryption, no authentication: loopback and trusted networks only."""
    SSL = "SSL"
    """TLS, optionally with a client certificate."""
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    """SASL authentication without encryption: the password crosses the network in clear for PLAIN."""
    SASL_SSL = "SASL_SSL"
    """SASL authentication over TLS: the usual choice for managed clusters."""


_SASL_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"})

#: librdkafka properties that load code or run commands. Config can come from environment variables and
#: Spark options, so these are refused outright (precedent: plugin.library.paths → RCE).
FORBIDDEN_OVERRIDES = frozenset(
    {"plugin.library.paths", "ssl.engine.location", "ssl.providers", "sasl.kerberos.kinit.cmd"}
)

#: Properties the config model owns; setting them through `overrides` would bypass validation.
_OWNED = frozenset(
    {
        "bootstrap.servers",
        "metadata.broker.list",  # librdkafka's older name for bootstrap.servers
        "client.id",
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
    }
)

#: Weakening these would silently disable TLS verification.
_MUST_STAY_SECURE = {
    "enable.ssl.certificate.verification": {"true"},
    "ssl.endpoint.identification.algorithm": {"https"},
    "enable.sasl.oauthbearer.unsecure.jwt": {"false"},
}

_SECRET_KEY = re.compile(r"(?i)password|passphrase|secret|token|jaas|credential|private|\.key\.pem$")


def _validate_path(name: str, path: str | None) -> None:
    if path is None:
        return
    # librdkafka takes a directory of CA certificates (OpenSSL's c_rehash layout) as ssl.ca.location
    if name == "ssl_ca_location" and os.path.isdir(path):
        return
    if not os.path.isfile(path):
        raise ConfigError(name, path, "file does not exist")


def validate_overrides(name: str, overrides: Mapping[str, object], *, allow_insecure: bool = False) -> None:
    """Refuse librdkafka overrides that load code, bypass a `KafkaConfig` field or weaken TLS/SASL (unless
    `allow_insecure`). `name` is the field reported, e.g. `consumer_overrides`: every path that hands
    properties to a client (KafkaConfig, RetryApp, the client factories) goes through here."""
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(name, key, "keys must be non-empty librdkafka property names")
        if key in FORBIDDEN_OVERRIDES:
            raise ConfigError(f"{name}[{key}]", "[hidden]", "refused: this property loads code or runs commands")
        if key in _OWNED:
            raise ConfigError(f"{name}[{key}]", "[hidden]", "set it through its own KafkaConfig field")
        shown = _shown(key, value)
        if key.startswith("java.") or key in {"sasl.jaas.config", "ssl.truststore.location"}:
            raise ConfigError(f"{name}[{key}]", shown, "a Java client property; use librdkafka's name")
        secure = _MUST_STAY_SECURE.get(key)
        if secure and _text(value) not in secure and not allow_insecure:
            raise ConfigError(f"{name}[{key}]", shown, "weakens TLS/SASL security; set allow_insecure=True to insist")


def _shown(key: str, value: object) -> object:
    """What an error may print of an override: never the value of a key that names a secret."""
    return "[hidden]" if _SECRET_KEY.search(key) else value


def _text(value: object) -> str:
    # librdkafka reads booleans as true/false, 1/0 (any case); compare in one spelling
    text = str(value).strip().lower()
    return {"1": "true", "0": "false"}.get(text, text)


def redact(config: Mapping[str, object]) -> dict[str, object]:
    """A copy of a client config that is safe to log: secret-looking values become `[hidden]`."""
    return {k: ("[hidden]" if _SECRET_KEY.search(k) else v) for k, v in config.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaConfig:
    """How to reach the Kafka cluster.

    >>> KafkaConfig(bootstrap="127.0.0.1:9092").client_config()["bootstrap.servers"]
    '127.0.0.1:9092'

    `overrides` carries any other librdkafka property (names as in librdkafka's CONFIGURATION.md, not the
    Java client's). Properties that load code, or that turn TLS verification off, are refused unless
    `allow_insecure=True` is given explicitly for the latter.
    """

    bootstrap: str
    client_id: str = "retrytopics"
    security_protocol: SecurityProtocol | str = SecurityProtocol.PLAINTEXT
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    overrides: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    producer_overrides: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    consumer_overrides: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    allow_insecure: bool = False

    def __post_init__(self) -> None:
        self._validate_bootstrap()
        self._validate_security()
        for name in ("overrides", "producer_overrides", "consumer_overrides"):
            self._validate_overrides(name, getattr(self, name))
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def _validate_bootstrap(self) -> None:
        servers = [s.strip() for s in (self.bootstrap or "").split(",") if s.strip()]
        if not servers:
            raise ConfigError("bootstrap", self.bootstrap, "at least one host:port is required")
        for server in servers:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError("bootstrap", self.bootstrap, f"{server!r} is not host:port")
        if not self.client_id or not self.client_id.strip():
            raise ConfigError("client_id", self.client_id, "must not be empty")

    def _validate_security(self) -> None:
        try:
            protocol = SecurityProtocol(str(self.security_protocol).upper())
        except ValueError:
            allowed = ", ".join(p.value for p in SecurityProtocol)
            raise ConfigError("security_protocol", self.security_protocol, f"must be one of {allowed}") from None
        object.__setattr__(self, "security_protocol", protocol)
        if protocol.value.startswith("SASL"):
            mechanism = (self.sasl_mechanism or "").strip().upper()
            if mechanism not in _SASL_MECHANISMS:
                raise ConfigError(
                    "sasl_mechanism", self.sasl_mechanism, f"must be one of {', '.join(sorted(_SASL_MECHANISMS))}"
                )
            # librdkafka matches mechanism names case-sensitively: "plain" would pass here and fail there
            object.__setattr__(self, "sasl_mechanism", mechanism)
            if mechanism in {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}:
                if not self.sasl_username:
                    raise ConfigError("sasl_username", self.sasl_username, f"required for SASL {mechanism}")
                if not self.sasl_password:
                    # never echo a secret, even an empty one
                    raise ConfigError("sasl_password", "[hidden]", f"required for SASL {mechanism}")
        elif self.sasl_mechanism or self.sasl_username or self.sasl_password:
            raise ConfigError(
                "security_protocol", protocol.value, "SASL settings were given but the protocol does not use SASL"
            )
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            _validate_path(name, getattr(self, name))

    def _validate_overrides(self, name: str, overrides: Mapping[str, object]) -> None:
        validate_overrides(name, overrides, allow_insecure=self.allow_insecure)
        for key, value in overrides.items():
            # a TOML sub-table or array would reach librdkafka as its Python repr
            if not isinstance(value, str | int | float | bool):
                raise ConfigError(f"{name}[{key}]", type(value).__name__, "expected a string, number or boolean")

    def client_config(self) -> dict[str, str | int | float | bool]:
        """librdkafka properties common to every client (secrets included: never log this, use `redact`)."""
        config: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": self.client_id,
            "security.protocol": str(self.security_protocol),
        }
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password,
        }
        config.update({k: v for k, v in optional.items() if v is not None})
        config.update(self.overrides)
        return config

    def producer_config(self) -> dict[str, str | int | float | bool]:
        """`client_config()` plus the producer-only overrides."""
        return {**self.client_config(), **self.producer_overrides}

    def consumer_config(self) -> dict[str, str | int | float | bool]:
        """`client_config()` plus the consumer-only overrides."""
        return {**self.client_config(), **self.consumer_overrides}

    def with_overrides(
        self,
        common: Mapping[str, str | int | float | bool] | None = None,
        *,
        producer: Mapping[str, str | int | float | bool] | None = None,
        consumer: Mapping[str, str | int | float | bool] | None = None,
    ) -> KafkaConfig:
        """A copy with more librdkafka overrides, e.g. `cfg.with_overrides(producer={"linger.ms": 50})`."""
        return replace(
            self,
            overrides={**self.overrides, **(common or {})},
            producer_overrides={**self.producer_overrides, **(producer or {})},
            consumer_overrides={**self.consumer_overrides, **(consumer or {})},
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, prefix: str = "KAFKA_") -> KafkaConfig:
        """Build from `KAFKA_BOOTSTRAP_SERVERS`, `KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_MECHANISM`,
        `KAFKA_SASL_USERNAME`, `KAFKA_SASL_PASSWORD`, `KAFKA_SSL_CA_LOCATION`, `KAFKA_CLIENT_ID`."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, str] = {}
        for name in (
            "client_id",
            "security_protocol",
            "sasl_mechanism",
            "sasl_username",
            "sasl_password",
            "ssl_ca_location",
            "ssl_certificate_location",
            "ssl_key_location",
            "ssl_key_password",
        ):
            value = env.get(prefix + name.upper())
            if value:
                kwargs[name] = value
        return cls(bootstrap=env.get(prefix + "BOOTSTRAP_SERVERS", ""), **kwargs)  # type: ignore[arg-type]


def check_replication(replication_factor: int, min_insync_replicas: object, *, field: str) -> None:
    """Refuse a replication factor that is not -1 (the broker's default) or >= 1, and a `min.insync.replicas`
    below 1 or above the replication factor (no acks=all write could ever succeed); `field` prefixes the
    setting named in the error."""
    valid_factor = isinstance(replication_factor, int) and not isinstance(replication_factor, bool)
    if not valid_factor or replication_factor == 0 or replication_factor < -1:
        raise ConfigError(
            f"{field}.replication_factor", replication_factor, "must be -1 (the broker's default) or >= 1"
        )
    if min_insync_replicas is None:
        return
    text = str(min_insync_replicas)
    if isinstance(min_insync_replicas, bool) or not text.isascii() or not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{field}.min_insync_replicas", min_insync_replicas, "must be an integer >= 1")
    if replication_factor != -1 and int(text) > replication_factor:
        raise ConfigError(
            f"{field}.min_insync_replicas",
            min_insync_replicas,
            f"must not exceed the replication factor ({replication_factor}): no acks=all write could succeed",
        )
