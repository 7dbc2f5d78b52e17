"""SASL_SSL, SCRAM-SHA-512 and the standard authorizer for the local Apache Kafka broker (`connectors.apache`).

Pure: renders server.properties entries and StorageTool arguments; `ApacheKafkaBroker(security=...)` writes
and runs them::

    security = BrokerSecurity(keystore=Path("broker.pem"), truststore=Path("ca.pem"), key_password=...,
                              users={"admin": ..., "billing": ...}, admin="admin")
    with ApacheKafkaBroker(security=security) as broker:
        kafka = broker.kafka_config(**security.client_fields("billing"))

What the broker then enforces:
- the client listener and the inter-broker listener speak SASL_SSL with SCRAM-SHA-512 only; the broker talks
  to itself as `admin` (a super user), so the listener clients reach is never a way around authentication;
- the controller listener stays PLAINTEXT (KRaft's broker-to-controller channel on loopback): its principal,
  `User:ANONYMOUS`, is a super user, because the broker must register with the controller before any ACL can
  exist. Clients are never advertised that listener;
- `StandardAuthorizer` with no ACL means no access (`allow.everyone.if.no.acl.found=false`), except for the
  super users;
- SCRAM credentials are written into the metadata log when the storage is formatted. That passes the
  passwords on the StorageTool's command line for the second it runs: fine for a test broker on this
  machine, not how to provision a real cluster (use `kafka-configs --alter --add-config SCRAM-SHA-512=...`
  with a file, or an admin client).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from retrytopics.core.errors import ConfigError

__all__ = ["AUTHORIZER", "SCRAM_MECHANISM", "BrokerSecurity"]

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_MECHANISM = "SCRAM-SHA-512"
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
_SAFE = re.compile(r"[A-Za-z0-9._~-]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerSecurity:
    """TLS material (PEM files) and SCRAM users for a broker started by `ApacheKafkaBroker`.

    `keystore` holds the broker's PKCS#8 private key (encrypted with `key_password`, if given) followed by its
    certificate chain; the certificate must name the broker's host (e.g. `IP:127.0.0.1`), since clients verify
    it. `truststore` is the CA clients are given too. `users` maps SCRAM-SHA-512 user names to passwords;
    `admin` is one of them: a super user, and the broker's own inter-broker principal. Passwords stay out of
    `repr`.
    """

    keystore: Path
    truststore: Path
    users: Mapping[str, str] = field(repr=False)
    admin: str
    key_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("keystore", "truststore"):
            if not Path(getattr(self, name)).is_file():
                raise ConfigError(name, str(getattr(self, name)), "PEM file does not exist")
        if self.admin not in self.users:
            raise ConfigError("admin", self.admin, "must be one of the SCRAM users")
        for name, password in self.users.items():
            # StorageTool's --add-scram syntax is [name=...,password=...]: a comma, bracket or quote would split it
            if not _SAFE.fullmatch(name) or not _SAFE.fullmatch(password):
                raise ConfigError(f"users[{name!r}]", "[hidden]", "names and passwords must match [A-Za-z0-9._~-]+")
        object.__setattr__(self, "users", MappingProxyType(dict(self.users)))

    def server_properties(self, listeners: tuple[str, ...]) -> dict[str, str]:
        """server.properties entries that secure the named listeners (SASL_SSL + SCRAM) and turn ACLs on."""
        admin_login = f'{_SCRAM_LOGIN} required username="{self.admin}" password="{self.users[self.admin]}";'
        properties = {
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.truststore),
            "ssl.endpoint.identification.algorithm": "https",
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{self.admin};User:ANONYMOUS",
        }
        if self.key_password is not None:
            properties["ssl.key.password"] = self.key_password
        for listener in listeners:
            properties[f"listener.name.{listener.lower()}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"] = admin_login
        return properties

    def format_arguments(self) -> list[str]:
        """StorageTool `format` arguments that create every SCRAM user in the new metadata log."""
        arguments: list[str] = []
        for name, password in self.users.items():
            arguments += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
        return arguments

    def client_fields(self, user: str) -> dict[str, str]:
        """`KafkaConfig` fields for `user` over SASL_SSL, trusting this broker's CA."""
        if user not in self.users:
            raise ConfigError("user", user, f"not a SCRAM user of this broker: {sorted(self.users)}")
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": SCRAM_MECHANISM,
            "sasl_username": user,
            "sasl_password": self.users[user],
            "ssl_ca_location": str(self.truststore),
        }
