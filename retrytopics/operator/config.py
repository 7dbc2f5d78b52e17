"""Operator settings for the CLI: one frozen model merged from a TOML file, the environment and flags.

Precedence, lowest first: defaults < the app's own code (`RetryApp(kafka=KafkaConfig(...))`, for `run` and
`tiers`) < TOML file < environment < command-line flags: a Kafka setting given in any layer replaces the
app's value field by field (`Settings.kafka_over`), and `[kafka.overrides]` adds to the app's. The TOML file
is `--config FILE`, or `RETRYTOPICS_CONFIG` when no flag is given. Every error is a
`ConfigError` whose field is the dotted setting name (`kafka.bootstrap`, `app.delays[1]`) and says where
the value came from. Secrets are read from the environment or a file, never from argv (argv is visible to
every user of the machine through /proc).

    # retrytopics.toml
    [kafka]
    bootstrap = "broker-1:9092,broker-2:9092"
    security_protocol = "SASL_SSL"
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_username = "billing"
    sasl_password_file = "/run/secrets/kafka-password"   # or RETRYTOPICS_KAFKA_SASL_PASSWORD
    [kafka.overrides]
    "socket.timeout.ms" = 30000
    [app]
    topic = "orders"
    group = "billing"
    delays = ["5s", "30s", "5m"]
    consumer = "share"          # run, topics create: a share-group main consumer (default: the app's choice)
    key_ordering = true         # topics create, describe: also the key-state topic of a key-ordered handler
    flood_guard = true          # topics create: also the flood-guard topic of a guarded handler
    concurrency = 200           # run, tiers: handler calls in flight per consumer (`topic`'s handler, else every one)
    [metrics]
    port = 9102
    [logging]
    level = "INFO"
    json = true

Environment variables: `RETRYTOPICS_<SECTION>_<KEY>` (e.g. `RETRYTOPICS_KAFKA_BOOTSTRAP`,
`RETRYTOPICS_APP_GROUP`, `RETRYTOPICS_METRICS_PORT`); `KAFKA_BOOTSTRAP_SERVERS` is honoured as a fallback.
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from retrytopics.connectors.config import KafkaConfig, check_replication
from retrytopics.core.concurrency import concurrency_of
from retrytopics.core.durations import parse_duration
from retrytopics.core.errors import ConfigError
from retrytopics.core.naming import NamingStrategy, validate_topic_name
from retrytopics.core.signing import HeaderKeys

__all__ = ["AppSettings", "LoggingSettings", "Settings", "instant_argument", "load_settings", "parse_instant"]

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

#: Accepted keys per section, with the type each one is coerced to from text (environment, flags).
_SCHEMA: dict[str, dict[str, type]] = {
    "kafka": {
        "bootstrap": str,
        "client_id": str,
        "security_protocol": str,
        "sasl_mechanism": str,
        "sasl_username": str,
        "sasl_password": str,
        "sasl_password_file": str,
        "ssl_ca_location": str,
        "ssl_certificate_location": str,
        "ssl_key_location": str,
        "ssl_key_password": str,
        "overrides": dict,
        "producer_overrides": dict,
        "consumer_overrides": dict,
    },
    "app": {
        "topic": str,
        "group": str,
        "delays": list,
        "partitions": int,
        "replication_factor": int,
        "min_insync_replicas": int,
        "naming": str,
        "dlq": str,
        "header_key": str,
        "header_key_file": str,
        "consumer": str,
        "key_ordering": bool,
        "flood_guard": bool,
        "concurrency": int,
    },
    "metrics": {"port": int},
    "logging": {"level": str, "json": bool},
}
_SECRETS = {"kafka.sasl_password", "kafka.ssl_key_password", "app.header_key"}
_INTEGER = re.compile(r"[+-]?[0-9]+")
_ONE_OF = {"app.header_key": "header_key_file", "app.header_key_file": "header_key"}


@dataclass(frozen=True, slots=True, kw_only=True)
class AppSettings:
    """Which retry pipeline the CLI acts on (for commands that take no APP:OBJECT)."""

    topic: str | None = None
    group: str | None = None
    delays: tuple[str, ...] | None = None  # None: not given; commands that need it say so (no silent ladder)
    partitions: int | None = None  # None: as many as the source topic
    replication_factor: int = -1  # -1: the broker's default.replication.factor
    min_insync_replicas: int | None = None  # None: the broker's default min.insync.replicas
    naming: NamingStrategy = NamingStrategy.BY_DELAY
    dlq: str | None = None
    #: signed retry headers (`RetryApp(header_key=...)`): from `[app] header_key_file` (one key per line, the
    #: first signs), `RETRYTOPICS_APP_HEADER_KEY` (keys separated by commas) or the app; never from argv
    header_keys: HeaderKeys | None = field(default=None, repr=False)
    #: `run`, `topics create`: the main consumer's model, "group" or "share" (`RetryApp(consumer=...)`); None:
    #: the app's own
    consumer: str | None = None
    #: `topics create`: the handler is key-ordered (`ordering=KeyOrdering(...)`), so its compacted key-state
    #: topic is provisioned with the tiers (docs/key-ordering.md)
    key_ordering: bool = False
    #: `topics create`: the handler has a retry-flood guard (`flood_guard=FloodGuard(...)`), so its compacted
    #: flood-guard topic is provisioned with the tiers (docs/flood-guard.md)
    flood_guard: bool = False
    #: `run`, `tiers`: calls in flight per consumer (`concurrency=` of `topic`'s handler, else of every handler;
    #: docs/concurrency.md); None: the app's own
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.consumer not in (None, "group", "share"):
            raise ConfigError("app.consumer", self.consumer, "expected group or share")
        for name in ("topic", "group", "dlq"):
            value = getattr(self, name)
            if value is not None:
                validate_topic_name(value, field=f"app.{name}")
        for i, delay in enumerate(self.delays or ()):
            parse_duration(delay, field=f"app.delays[{i}]")
        if self.partitions is not None and self.partitions < 1:
            raise ConfigError("app.partitions", self.partitions, "must be at least 1")
        if self.concurrency is not None:
            concurrency_of(self.concurrency, field="app.concurrency")
        check_replication(self.replication_factor, self.min_insync_replicas, field="app")

    def require(self, *names: str) -> None:
        """Fail with the field named when a command needs a setting that is not set."""
        for name in names:
            if getattr(self, name) is None:
                raise ConfigError(
                    f"app.{name}",
                    None,
                    f"required: pass --{name}, set it in [app], or name the app with --app MODULE:OBJECT",
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingSettings:
    level: str = "INFO"
    json: bool = False

    def __post_init__(self) -> None:
        if self.level.upper() not in _LOG_LEVELS:
            raise ConfigError("logging.level", self.level, f"must be one of {', '.join(_LOG_LEVELS)}")
        object.__setattr__(self, "level", self.level.upper())


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything a CLI command needs. `kafka` is None when no bootstrap was given anywhere (commands that
    start the embedded broker fill it in themselves)."""

    kafka: KafkaConfig | None
    app: AppSettings = field(default_factory=AppSettings)
    metrics_port: int | None = None
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    #: The Kafka settings given in some layer (TOML, environment, flags), secrets resolved; applied over an
    #: app's own KafkaConfig by `kafka_over`.
    kafka_fields: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: The [app] settings given in some layer; applied over the pipeline an app module describes by `app_over`.
    app_fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise ConfigError("metrics.port", self.metrics_port, "must be a TCP port, 1 to 65535")

    def kafka_over(self, base: KafkaConfig) -> KafkaConfig:
        """`base` (an app's own config) with every Kafka setting given in the TOML file, the environment or
        a flag replacing its value; `overrides` tables are merged, key by key."""
        fields = dict(self.kafka_fields)
        for name in ("overrides", "producer_overrides", "consumer_overrides"):
            if name in fields:
                fields[name] = {**getattr(base, name), **fields[name]}
        return _validated_kafka(lambda: replace(base, **fields))

    def app_over(self, base: AppSettings) -> AppSettings:
        """`base` (the pipeline of an app module) with every [app] setting given in some layer replacing it."""
        return replace(base, **self.app_fields)

    def require_kafka(self) -> KafkaConfig:
        if self.kafka is None:
            raise ConfigError(
                "kafka.bootstrap",
                None,
                "required: pass --bootstrap, set RETRYTOPICS_KAFKA_BOOTSTRAP or KAFKA_BOOTSTRAP_SERVERS, or [kafka] bootstrap",
            )
        return self.kafka


def _coerce(dotted: str, value: Any, kind: type, origin: str) -> Any:
    shown = "[hidden]" if dotted in _SECRETS else value
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    if not isinstance(value, str):
        raise ConfigError(dotted, shown, f"expected {kind.__name__} (from {origin})")
    text = value.strip()
    if kind is int:
        # not str.isdigit: it accepts "²" and a stripped "--5", which int() then refuses with a bare ValueError
        if not _INTEGER.fullmatch(text):
            raise ConfigError(dotted, shown, f"expected an integer (from {origin})")
        return int(text)
    if kind is bool:
        if text.lower() not in {"true", "false", "1", "0", "yes", "no"}:
            raise ConfigError(dotted, shown, f"expected true or false (from {origin})")
        return text.lower() in {"true", "1", "yes"}
    if kind is list:
        return [part.strip() for part in text.split(",") if part.strip()]
    if kind is dict:
        raise ConfigError(dotted, shown, f"set tables in the TOML file, not from {origin}")
    return text


def _merge_layer(merged: dict[str, dict[str, Any]], layer: Mapping[str, Any], origin: str) -> None:
    for section, values in layer.items():
        if section not in _SCHEMA:
            raise ConfigError(section, None, f"unknown section (from {origin}); known: {', '.join(_SCHEMA)}")
        if not isinstance(values, Mapping):
            raise ConfigError(section, values, f"expected a table (from {origin})")
        for key, value in values.items():
            dotted = f"{section}.{key}"
            if key not in _SCHEMA[section]:
                known = ", ".join(sorted(_SCHEMA[section]))
                raise ConfigError(dotted, None, f"unknown setting (from {origin}); known in [{section}]: {known}")
            if value is not None:
                merged[section][key] = _coerce(dotted, value, _SCHEMA[section][key], origin)
                if dotted in _ONE_OF:  # a key or a key file: the higher layer's choice replaces the other
                    merged[section].pop(_ONE_OF[dotted], None)


def _from_environment(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    layer: dict[str, dict[str, str]] = {}
    if environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        layer.setdefault("kafka", {})["bootstrap"] = environ["KAFKA_BOOTSTRAP_SERVERS"]
    for section, keys in _SCHEMA.items():
        for key, kind in keys.items():
            value = environ.get(f"RETRYTOPICS_{section}_{key}".upper())
            if value is not None and kind is not dict:
                layer.setdefault(section, {})[key] = value
    return layer


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError("config", str(path), "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"not valid TOML: {exc}") from None


def _read_secret_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError("kafka.sasl_password_file", path, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        # never echo the bytes: they are (part of) a secret
        raise ConfigError("kafka.sasl_password_file", path, "not UTF-8 text") from None


def _header_keys(app: dict[str, Any]) -> None:
    """Replace `header_key` (keys separated by commas) or `header_key_file` (one key per line) in the [app]
    settings by `header_keys`; the first key signs. At most one of the two is set (see `_ONE_OF`)."""
    text, path = app.pop("header_key", None), app.pop("header_key_file", None)
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("app.header_key_file", path, f"cannot read: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError("app.header_key_file", path, "not UTF-8 text") from None
        keys = [line.strip() for line in text.splitlines() if line.strip()]
        field_name = "app.header_key_file"
    elif text:
        keys = [part.strip() for part in text.split(",") if part.strip()]
        field_name = "app.header_key"
    else:
        return
    app["header_keys"] = HeaderKeys.of(keys, field=field_name)


def _kafka_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The [kafka] settings as KafkaConfig keyword arguments, the password file read."""
    values = dict(values)
    password_file = values.pop("sasl_password_file", None)
    if password_file and not values.get("sasl_password"):
        values["sasl_password"] = _read_secret_file(password_file)
    return values


def _validated_kafka(build: Callable[[], KafkaConfig]) -> KafkaConfig:
    try:
        return build()
    except ConfigError as exc:
        raise ConfigError(f"kafka.{exc.field}", exc.value, exc.reason) from None


def _kafka_config(fields: dict[str, Any]) -> KafkaConfig | None:
    """A KafkaConfig when a bootstrap was given somewhere; otherwise None (an app module may bring its own,
    and commands that need one say so through `Settings.require_kafka`)."""
    if not fields.get("bootstrap"):
        return None
    return _validated_kafka(lambda: KafkaConfig(**fields))


def load_settings(
    *,
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> Settings:
    """Merge defaults < TOML file (`path`, else `RETRYTOPICS_CONFIG`) < environment < flags into one
    validated `Settings`.

    `flags` uses the file's shape, e.g. `{"kafka": {"bootstrap": "h:9092"}, "app": {"group": "billing"}}`;
    None values mean "flag not given".
    """
    merged: dict[str, dict[str, Any]] = {section: {} for section in _SCHEMA}
    environ = os.environ if environ is None else environ
    path = path or environ.get("RETRYTOPICS_CONFIG") or None
    if path is not None:
        _merge_layer(merged, _read_toml(Path(path)), f"file {path}")
    _merge_layer(merged, _from_environment(environ), "environment")
    if flags:
        _merge_layer(merged, flags, "command line")
    if "sasl_password" in (flags or {}).get("kafka", {}):
        raise ConfigError("kafka.sasl_password", "[hidden]", "secrets are never taken from the command line")
    if (flags or {}).get("app", {}).get("header_key") is not None:
        raise ConfigError(
            "app.header_key",
            "[hidden]",
            "secrets are never taken from the command line; use --header-key-file or RETRYTOPICS_APP_HEADER_KEY",
        )
    app = dict(merged["app"])
    _header_keys(app)
    if "delays" in app:
        app["delays"] = tuple(app["delays"])
    if "naming" in app:
        try:
            app["naming"] = NamingStrategy(app["naming"])
        except ValueError:
            known = ", ".join(s.value for s in NamingStrategy)
            raise ConfigError("app.naming", app["naming"], f"must be one of {known}") from None
    kafka_fields = _kafka_fields(merged["kafka"])
    return Settings(
        kafka=_kafka_config(kafka_fields),
        app=AppSettings(**app),
        metrics_port=merged["metrics"].get("port"),
        logging=LoggingSettings(**merged["logging"]),
        kafka_fields=kafka_fields,
        app_fields=app,
    )


def parse_instant(text: str, *, field: str) -> int:
    """A point in time as epoch milliseconds, from epoch ms (`1700000000000`) or ISO-8601
    (`2026-11-23T16:50:00Z`, `2026-11-23T16:50:00+01:00`, `2026-11-23`). A time without a zone is refused:
    read as local time, the same command would select other records on another machine."""
    text = text.strip()
    if _INTEGER.fullmatch(text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            field, text, "expected epoch milliseconds or an ISO-8601 time such as 2026-11-23T16:50:00Z"
        ) from None
    if moment.tzinfo is None:
        if len(text) > 10:
            raise ConfigError(field, text, "add a time zone (Z or +01:00); a date alone means midnight UTC")
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def instant_argument(flag: str) -> Callable[[str], int]:
    """An argparse `type=` for a time flag such as `--since`: epoch ms or ISO-8601, in epoch ms."""

    def parse(text: str) -> int:
        try:
            return parse_instant(text, field=flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(exc.reason) from None

    return parse
