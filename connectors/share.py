"""confluent-kafka's `ShareConsumer` (a preview API since 2.15) behind `retrytopics.core.ports.ShareConsumerPort`.

A share-group member (KIP-932) in explicit acknowledgement mode: `poll` returns a batch of acquired records
as `ports.Message` values carrying their delivery count, `acknowledge` records ACCEPT / RELEASE / REJECT by
coordinates (so no confluent-kafka object outlives the poll), `commit` sends them. The 2.16 client has no
RENEW (KIP-1222): `supports_renew` is False and a RENEW is refused here, before it could reach the client
(docs/share-groups.md says what that means for long handlers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import AcknowledgeType, IllegalStateException, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CKTopicPartition

from retrytopics.connectors.clients import message_from_client
from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import kafka_client_error, make_share_consumer, map_kafka_errors
from retrytopics.core.errors import KafkaClientError
from retrytopics.core.ports import AcknowledgedCallback, AckType, Message, TopicPartition

__all__ = ["KafkaShareConsumer"]

log = logging.getLogger("retrytopics.kafka")

_CLIENT_ACK = {
    AckType.ACCEPT: AcknowledgeType.ACCEPT,
    AckType.RELEASE: AcknowledgeType.RELEASE,
    AckType.REJECT: AcknowledgeType.REJECT,
}


def _state_error(exc: IllegalStateException) -> KafkaClientError:
    # the client's own misuse checks (a batch not acknowledged before the next poll, a record no longer held)
    return KafkaClientError(f"share consumer: {exc}", code="ILLEGAL_STATE")


class KafkaShareConsumer:
    """`ShareConsumerPort` over a confluent-kafka `ShareConsumer`."""

    supports_renew = False  # confluent-kafka 2.16's AcknowledgeType has ACCEPT, RELEASE, REJECT only

    def __init__(self, kafka: KafkaConfig, *, group_id: str, overrides: Mapping[str, Any] | None = None) -> None:
        self._consumer = make_share_consumer(kafka, group_id=group_id, overrides=overrides)
        self.group_id = group_id

    def subscribe(self, topics: Sequence[str], *, on_acknowledged: AcknowledgedCallback | None = None) -> None:
        with map_kafka_errors():
            self._consumer.subscribe(list(topics))
            if on_acknowledged is not None:
                self._consumer.set_acknowledgement_commit_callback(_relay(on_acknowledged))

    def poll(self, timeout_s: float) -> list[Message]:
        try:
            batch = self._consumer.poll(timeout_s)
        except KafkaException as exc:
            raise kafka_client_error(exc) from exc
        except IllegalStateException as exc:
            raise _state_error(exc) from exc
        out: list[Message] = []
        for msg in batch:
            err = msg.error()
            if err is None:
                out.append(message_from_client(msg)._replace(delivery_count=msg.delivery_count()))
            elif err.fatal():
                raise KafkaClientError(f"{err.name()}: {err.str()}", code=err.name(), fatal=True)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("share consumer error: %s", err)
        return out

    def acknowledge(self, message: Message, ack: AckType) -> None:
        client_ack = _CLIENT_ACK.get(ack)
        if client_ack is None:
            raise KafkaClientError(
                f"confluent-kafka's share consumer cannot send {ack.name} (its AcknowledgeType has "
                f"{', '.join(t.name for t in AcknowledgeType)})",
                code="UNSUPPORTED_ACKNOWLEDGEMENT",
            )
        try:
            self._consumer.acknowledge_offset(message.topic, message.partition, message.offset, client_ack)
        except IllegalStateException as exc:
            raise _state_error(exc) from exc

    def commit(self, *, asynchronous: bool, timeout_s: float = 30.0) -> dict[TopicPartition, KafkaClientError | None]:
        try:
            if asynchronous:
                self._consumer.commit_async()
                return {}
            answers = self._consumer.commit_sync(timeout_s)
        except KafkaException as exc:
            raise kafka_client_error(exc) from exc
        except IllegalStateException as exc:
            raise _state_error(exc) from exc
        return {
            (tp.topic, tp.partition): None if failure is None else kafka_client_error(failure)
            for tp, failure in answers.items()
        }

    def close(self) -> None:
        try:
            self._consumer.close()
        except KafkaException as exc:
            raise kafka_client_error(exc) from exc


def _relay(on_acknowledged: AcknowledgedCallback) -> Any:
    def relay(offsets: dict[CKTopicPartition, set[int]], exc: KafkaException | None) -> None:
        plain = {(tp.topic, tp.partition): frozenset(done) for tp, done in offsets.items()}
        on_acknowledged(plain, None if exc is None else kafka_client_error(exc))

    return relay
