"""Checks and resolution that run before a command does any work: the app module a command names, the
Kafka config and pipeline it acts on (settings layered over the app's own), librdkafka's verdict on override
tables, optional extras, and what to check when no broker answers. Every failure is a `ConfigError` that
names the setting, so the CLI exits 2 before connecting to anything.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import ConfigError
from retrytopics.operator.config import AppSettings, Settings

__all__ = [
    "UNREACHABLE",
    "app_pipeline",
    "check_kafka",
    "command_kafka",
    "connection_hint",
    "load_app",
    "pipeline_of",
    "prepare_app",
    "require_extra",
]


def require_extra(field: str, value: object, module: str, extra: str) -> None:
    """Fail before any work (no broker connection, no Spark job) when an optional dependency is missing."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module blocked as None in sys.modules
        found = False
    if not found:
        raise ConfigError(
            field, value, f"needs the {extra} extra ({module} is not installed): pip install 'retrytopics[{extra}]'"
        )


def command_kafka(settings: Settings) -> KafkaConfig:
    """The settings' KafkaConfig, its librdkafka override tables judged by librdkafka before any work."""
    kafka = settings.require_kafka()
    check_kafka(kafka)
    return kafka


def check_kafka(kafka: KafkaConfig) -> None:
    """librdkafka's own verdict on the override tables (misspelt or ill-typed properties), field named."""
    from retrytopics.connectors.kafka import check_properties

    check_properties("kafka.overrides", kafka.overrides)
    check_properties("kafka.producer_overrides", kafka.producer_overrides, producer=True)
    check_properties("kafka.consumer_overrides", kafka.consumer_overrides)


def pipeline_of(app_reference: str | None, settings: Settings) -> tuple[KafkaConfig, AppSettings]:
    """The KafkaConfig and pipeline a command acts on. With `--app MODULE:OBJECT`, the app's own config and
    topics are the lowest layer, and TOML, environment and flags override them field by field."""
    if not app_reference:
        return command_kafka(settings), settings.app
    app = load_app(app_reference)
    kafka = settings.kafka_over(app.kafka)
    check_kafka(kafka)
    return kafka, settings.app_over(app_pipeline(app, settings.app_fields.get("topic")))


def app_pipeline(app: Any, topic: str | None) -> AppSettings:
    """The AppSettings that name the topics of one of `app`'s handlers (the only one unless `topic`)."""
    from retrytopics.core.durations import format_duration
    from retrytopics.operator.ops import pipeline_topics

    handled = sorted(app.handlers)
    if topic is None:
        if len(handled) != 1:
            raise ConfigError("app.topic", None, f"the app handles {handled}: pass --topic to choose one")
        topic = handled[0]
    own = app.topics(topic)  # a ConfigError naming the topic when the app does not handle it
    delays = tuple(format_duration(ms) for ms in app.handlers[topic].policy.tier_delays_ms)
    pipeline = AppSettings(topic=topic, group=app.group, delays=delays, naming=app.naming)
    # a DLQ name of the app's own choosing only; a default one follows a --group given over the app's
    custom_dlq = own.dlq if own.dlq != pipeline_topics(pipeline).dlq else None
    return AppSettings(
        topic=topic,
        group=app.group,
        delays=delays,
        naming=app.naming,
        dlq=custom_dlq,
        header_keys=app.handlers[topic].ctx.header_keys,
        consumer=app.consumer,
        key_ordering=app.handlers[topic].ordering is not None,
        flood_guard=topic in app.flood_guards,
    )


def prepare_app(reference: str, settings: Settings) -> Any:
    """The RetryApp of `run`/`tiers`, every Kafka setting given in the TOML file, the environment or a flag
    applied over its own KafkaConfig, and every override table judged by librdkafka: all before any I/O."""
    if settings.metrics_port is not None:
        require_extra("metrics.port", settings.metrics_port, "prometheus_client", "metrics")
    app = load_app(reference)
    app.kafka = settings.kafka_over(app.kafka)
    check_kafka(app.kafka)
    if settings.app.consumer is not None:
        app.consumer = settings.app.consumer  # a ConfigError naming exactly_once for an exactly-once app
    if settings.app.concurrency is not None:
        app.set_concurrency(settings.app.concurrency, topic=settings.app.topic)
    from retrytopics.connectors.kafka import check_properties

    check_properties("consumer_overrides", app.consumer_overrides)
    check_properties("producer_overrides", app.producer_overrides, producer=True)
    return app


def load_app(reference: str) -> Any:
    """`package.module:attribute` → a RetryApp (an operator's argument, never record data)."""
    from retrytopics.app import RetryApp

    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigError("app", reference, "expected MODULE:OBJECT, e.g. billing.consumers:app")
    # a console script's sys.path starts at its bin folder; users expect `run shop:app` next to shop.py to
    # work, as with uvicorn and gunicorn
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("app", reference, f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attribute, None)
    if not isinstance(app, RetryApp):
        raise ConfigError("app", reference, f"{attribute!r} is not a RetryApp (got {type(app).__name__})")
    return app


#: librdkafka codes of a request that reached no broker: a wrong address, a broker down, or a TLS handshake
#: refused (a wrong CA looks exactly like an unreachable broker from the request's side).
UNREACHABLE = {"_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_SSL", "TIMED_OUT"}


def connection_hint(code: str, last_error: str | None) -> str | None:
    """What to check when no broker answered; `last_error` is the latest background client error."""
    if code not in UNREACHABLE:
        return None
    if last_error and "authentication" in last_error.lower():
        return (
            f"the broker refused the credentials ({last_error}): check kafka.sasl_username, kafka.sasl_password "
            "(or kafka.sasl_password_file) and kafka.sasl_mechanism"
        )
    hint = "no broker answered: check kafka.bootstrap (host:port reachable from here, the broker up)"
    if last_error and any(word in last_error.lower() for word in ("ssl", "certificate", "handshake")):
        return (
            f"{hint}; the TLS handshake failed ({last_error}): check kafka.ssl_ca_location and kafka.security_protocol"
        )
    hint += "; with SSL or SASL_SSL, a wrong CA (kafka.ssl_ca_location) or protocol (kafka.security_protocol) fails the same way"
    return f"{hint} (last client error: {last_error})" if last_error else hint
