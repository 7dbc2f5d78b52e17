"""confluent-kafka client factories with this product's safe defaults, and the one place where
confluent-kafka exceptions become retrytopics errors (`map_kafka_errors`).

Defaults and why:
- producers are idempotent with acks=all: a republish that the broker acknowledged is durable, and a
  retried send never duplicates a record within a producer session;
- consumers never auto-commit and never auto-store offsets: the runtime commits only what was handled
  or durably republished;
- `allow.auto.create.topics=false`: a typo must not silently create a topic; provisioning is explicit.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import AdminClient

from retrytopics.connectors.config import KafkaConfig, redact, validate_overrides
from retrytopics.core.errors import ConfigError, KafkaClientError, PublishError

__all__ = [
    "CONSUMER_DEFAULTS",
    "PRODUCER_DEFAULTS",
    "SHARE_CONSUMER_DEFAULTS",
    "OutageLog",
    "check_properties",
    "delivery_error",
    "kafka_client_error",
    "last_client_error",
    "make_admin",
    "make_consumer",
    "make_producer",
    "make_share_consumer",
    "map_kafka_errors",
    "open_tail",
]

log = logging.getLogger("retrytopics.kafka")
_librdkafka_log = logging.getLogger("retrytopics.librdkafka")

Properties = Mapping[str, str | int | float | bool]

PRODUCER_DEFAULTS: dict[str, str | int | float | bool] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "none",
}

CONSUMER_DEFAULTS: dict[str, str | int | float | bool] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "allow.auto.create.topics": False,
    "isolation.level": "read_committed",
}


#: The text of the latest error a client reported through error_cb (e.g. "SSL handshake failed: ...
#: certificate verify failed"): a failed metadata request only says `_TRANSPORT`, this says why.
_last_error: list[str] = []

#: librdkafka codes that mean "cannot reach the brokers"; it reports one per reconnect attempt (every
#: reconnect.backoff.ms, up to reconnect.backoff.max.ms = 10 s by default) for as long as that lasts.
_CONNECTION_CODES = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE", "_SSL", "_AUTHENTICATION", "_TIMED_OUT"})


class OutageLog:
    """One client's error_cb: logs a broker outage when it starts and when its cause changes, not once per
    reconnect attempt. An outage is over once no connection error came for `quiet_s` (longer than
    librdkafka's longest reconnect back-off, so a client still failing reports within it); the next error
    then starts a new outage. Other errors are logged every time."""

    def __init__(self, *, quiet_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()  # clients of one cluster share it, and each calls back from its own thread
        self._quiet_s = quiet_s
        self._clock = clock
        self._last_at: float | None = None
        self._causes: set[str] = set()
        self.last_error: str | None = None

    def level(self, err: KafkaError) -> int:
        """The level to log `err` at, updating the outage state."""
        if err.fatal():
            return logging.ERROR
        if err.name() not in _CONNECTION_CODES:
            return logging.WARNING
        with self._lock:
            return self._outage_level(err)

    def _outage_level(self, err: KafkaError) -> int:
        now = self._clock()
        if self._last_at is None or now - self._last_at > self._quiet_s:
            self._causes.clear()  # a new outage
        self._last_at = now
        # each kind of failure once per outage: librdkafka alternates some (a TLS failure comes as _SSL and
        # as _TRANSPORT), and "all brokers down" only repeats what the outage's first error already said
        cause, starts = err.name(), not self._causes
        if cause in self._causes:
            return logging.DEBUG
        self._causes.add(cause)
        return logging.WARNING if starts or cause != "_ALL_BROKERS_DOWN" else logging.DEBUG

    def __call__(self, err: KafkaError) -> None:
        _last_error[:] = [err.str()]
        self.last_error = err.str()
        level = self.level(err)
        if not log.isEnabledFor(level):
            return
        if err.name() == "_AUTHENTICATION":
            log.log(
                level,
                "kafka brokers refused the credentials: %s (check kafka.sasl_username, kafka.sasl_password "
                "and kafka.sasl_mechanism; librdkafka keeps retrying, repeats are logged at DEBUG)",
                err.str(),
                extra={"event": "broker.unreachable"},
            )
        elif err.name() in _CONNECTION_CODES:
            log.log(
                level,
                "kafka brokers unreachable: %s (check kafka.bootstrap, and with TLS kafka.ssl_ca_location; "
                "librdkafka keeps retrying, repeats are logged at DEBUG)",
                err.str(),
                extra={"event": "broker.unreachable"},
            )
        else:
            log.log(level, "kafka client error: %s", err.str(), extra={"event": "client.error"})


class _DropConnectFailures(logging.Filter):
    """librdkafka logs each failed connect (facility FAIL) and also reports it through error_cb: keep the
    error_cb line, whose repeats OutageLog turns down to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            isinstance(record.args, tuple)
            and record.args
            and record.args[0] == "FAIL"
            and not _librdkafka_log.isEnabledFor(logging.DEBUG)
        )


_librdkafka_log.addFilter(_DropConnectFailures())

#: One OutageLog per cluster: the consumers and producers of a process see the same outage, so it is
#: logged once, not once per client.
_outages: dict[str, OutageLog] = {}


def _outage_log(kafka: KafkaConfig) -> OutageLog:
    return _outages.setdefault(kafka.bootstrap, OutageLog())


#: Admin clients serve their error callbacks only when polled; `last_client_error` polls them. Each with its
#: cluster's bootstrap, so that a failed request of one cites that cluster's background error.
_admins: weakref.WeakKeyDictionary[AdminClient, str] = weakref.WeakKeyDictionary()


def last_client_error(kafka: KafkaConfig | None = None) -> str | None:
    """The latest error a client reported in the background, if any: a client of `kafka`'s cluster when it
    is given (a process talking to several clusters must not blame one for another), else any client."""
    _serve_admins()
    if kafka is not None:
        return _cluster_error(kafka.bootstrap)
    return _last_error[0] if _last_error else None


def _serve_admins() -> None:
    for admin in list(_admins.keys()):
        admin.poll(0)


def _cluster_error(bootstrap: str) -> str | None:
    _serve_admins()
    outage = _outages.get(bootstrap)
    return outage.last_error if outage else None


def _build(
    base: Properties, defaults: Properties, overrides: Properties | None, *, kafka: KafkaConfig
) -> dict[str, Any]:
    # the factories' own overrides go through the same refusals as KafkaConfig's tables: no path bypasses them
    validate_overrides("overrides", overrides or {}, allow_insecure=kafka.allow_insecure)
    config: dict[str, Any] = {**defaults, **base, **(overrides or {})}
    config.setdefault("error_cb", _outage_log(kafka))
    config.setdefault("logger", _librdkafka_log)
    return config


def make_producer(
    kafka: KafkaConfig, *, transactional_id: str | None = None, overrides: Properties | None = None
) -> Producer:
    """An idempotent, acks=all producer; transactional when `transactional_id` is given."""
    config = _build(kafka.producer_config(), PRODUCER_DEFAULTS, overrides, kafka=kafka)
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    log.debug("creating producer %s", redact(config))
    with map_kafka_errors():
        return Producer(config)


def make_consumer(kafka: KafkaConfig, *, group_id: str | None, overrides: Properties | None = None) -> Consumer:
    """A manually-committing consumer. `group_id=None` gives a throwaway id for assign()-only readers,
    which never join a group (librdkafka insists on a group.id even then)."""
    config = _build(kafka.consumer_config(), CONSUMER_DEFAULTS, overrides, kafka=kafka)
    config["group.id"] = group_id or f"retrytopics-reader-{uuid.uuid4().hex}"
    log.debug("creating consumer %s", redact(config))
    with map_kafka_errors():
        return Consumer(config)


#: A share consumer acknowledges each record itself: implicit mode would accept a whole batch on the next poll,
#: whatever the handler did. (Isolation and the offset reset are group configs for a share group.)
SHARE_CONSUMER_DEFAULTS: dict[str, str | int | float | bool] = {"share.acknowledgement.mode": "explicit"}


def make_share_consumer(kafka: KafkaConfig, *, group_id: str, overrides: Properties | None = None) -> ShareConsumer:
    """A share-group member (KIP-932) acknowledging explicitly; confluent-kafka's preview API."""
    config = _build(kafka.consumer_config(), SHARE_CONSUMER_DEFAULTS, overrides, kafka=kafka)
    config["group.id"] = group_id
    log.debug("creating share consumer %s", redact(config))
    with map_kafka_errors():
        return ShareConsumer(config)


def make_admin(kafka: KafkaConfig, *, overrides: Properties | None = None) -> AdminClient:
    """An admin client for provisioning and offset queries."""
    validate_overrides("overrides", overrides or {}, allow_insecure=kafka.allow_insecure)
    config: dict[str, Any] = {**kafka.client_config(), **(overrides or {})}
    config.setdefault("error_cb", _outage_log(kafka))
    config.setdefault("logger", _librdkafka_log)
    with map_kafka_errors():
        admin = AdminClient(config)
    _admins[admin] = kafka.bootstrap
    return admin


_QUIET = logging.getLogger("retrytopics.librdkafka.check")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def check_properties(field: str, properties: Properties, *, producer: bool = False) -> None:
    """Let librdkafka itself judge `properties` now, at start-up: a throwaway client without
    bootstrap.servers (it never connects) refuses a misspelt name or an ill-typed value, and the
    `ConfigError` names the property (e.g. `kafka.overrides[sockt.timeout.ms]`). Without this, the mistake
    surfaces only when a consumer loop builds its client."""
    refusal = _refusal(properties, producer=producer)
    if refusal is None:
        return
    # librdkafka names an alias by its canonical name (linger.ms -> queue.buffering.max.ms): find our key
    culprit = next((k for k in properties if _refusal({k: properties[k]}, producer=producer)), None)
    shown = "[hidden]" if culprit is None or redact({culprit: ""})[culprit] == "[hidden]" else properties[culprit]
    raise ConfigError(f"{field}[{culprit}]" if culprit else field, shown, f"librdkafka refused it: {refusal}")


def _refusal(properties: Properties, *, producer: bool) -> str | None:
    """librdkafka's complaint about `properties`, or None."""
    if not properties:
        return None
    config: dict[str, Any] = {**properties, "logger": _QUIET, "log_level": 0}
    try:
        if producer:
            Producer(config).flush(0)
        else:
            Consumer({**config, "group.id": "retrytopics-config-check"}).close()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        return err.str() if isinstance(err, KafkaError) else str(exc)
    return None


def _from_kafka_error(err: KafkaError, client: object | None = None) -> KafkaClientError:
    message = f"{err.name()}: {err.str()}"
    if err.name() in _CONNECTION_CODES - {"_TIMED_OUT", "_RESOLVE"}:
        # "Broker transport failure" alone hides why: a refused password or an untrusted certificate is only
        # in the background error the client reported (librdkafka's texts carry no secret); an admin client's
        # own cluster's, since another cluster's clients may report meanwhile
        bootstrap = _admins.get(client) if client is not None else None  # type: ignore[call-overload]
        cause = last_client_error() if bootstrap is None else _cluster_error(bootstrap)
        message += f" (the client reported: {cause})" if cause else ""
    return KafkaClientError(
        message, code=err.name(), retriable=err.retriable(), fatal=err.fatal(), abortable=err.txn_requires_abort()
    )


@contextmanager
def map_kafka_errors(client: object | None = None) -> Iterator[None]:
    """Translate confluent-kafka exceptions into `KafkaClientError` (raised `from` the original); `client`: the
    admin client making the request, whose cluster's background error a connection failure cites."""
    try:
        yield
    except KafkaException as exc:
        raise kafka_client_error(exc, client) from exc


def kafka_client_error(exc: KafkaException, client: object | None = None) -> KafkaClientError:
    """What `map_kafka_errors` raises for `exc` (raise it `from exc`): for hot paths that catch KafkaException
    themselves, since entering a generator-based context manager costs more than the call it guards."""
    _drop_foreign_links(exc)
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return _from_kafka_error(err, client)
    return KafkaClientError(str(exc))


def _drop_foreign_links(exc: BaseException) -> None:
    """confluent-kafka can leave a bare `KafkaError` (not an exception) as the `__context__` of the exception
    it raises (seen when a rebalance callback failed). Python's traceback code then fails on it, and with it
    every `log.exception` and pytest's report of the failure; cut such links, keep the real chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__cause__ is not None and not isinstance(current.__cause__, BaseException):
            current.__cause__ = None
        context = current.__context__
        if context is not None and not isinstance(context, BaseException):
            current.__context__ = None
            context = None
        current = current.__cause__ or context


def delivery_error(err: KafkaError, topic: str) -> PublishError:
    """A delivery-report error as a `PublishError` naming the destination topic."""
    return PublishError(topic, err.str(), code=err.name(), retriable=err.retriable(), fatal=err.fatal())


#: errors of a watermark query that a partition just created, or whose leader just moved, answers for a moment
_LEADERSHIP_SETTLING = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


def open_tail(kafka: KafkaConfig, topic: str, partitions: int, *, last: int, timeout_s: float = 10.0) -> Consumer:
    """An assign()-only consumer (no group, no commits) positioned `last` records before the end of each
    partition of `topic`. A partition without a known leader yet (just created, or its leader moving) is
    asked again until `timeout_s`."""
    consumer = make_consumer(kafka, group_id=None)
    deadline = time.monotonic() + timeout_s
    assignment = []
    with map_kafka_errors():
        for partition in range(partitions):
            low, high = _watermarks_once_led(consumer, TopicPartition(topic, partition), deadline)
            assignment.append(TopicPartition(topic, partition, max(low, high - last)))
        consumer.assign(assignment)
    return consumer


def _watermarks_once_led(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()), cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            if exc.args[0].code() not in _LEADERSHIP_SETTLING or time.monotonic() + 0.1 >= deadline:
                raise
            time.sleep(0.1)
