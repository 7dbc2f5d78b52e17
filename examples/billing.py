"""A billing consumer with non-blocking retries: the app that docker-compose.yml deploys.

Settings (bootstrap, topic, group, delays) come from the TOML file named by `RETRYTOPICS_CONFIG`, the
environment and defaults, exactly as the CLI reads them. Run it with:

    retrytopics run examples.billing:app          # the main consumer
    retrytopics tiers examples.billing:app --tier 30s   # one tier (scale these independently)
"""

from __future__ import annotations

import logging
import os
import random

from retrytopics import NonRetryable, Record, RetryApp, RetryPolicy, json_value
from retrytopics.operator.config import load_settings

log = logging.getLogger("examples.billing")

settings = load_settings(path=os.environ.get("RETRYTOPICS_CONFIG"))
settings.app.require("topic", "group", "delays")

app = RetryApp(kafka=settings.require_kafka(), group=settings.app.group or "", id_header="order-id")


class GatewayTimeout(Exception):
    """The payment gateway did not answer in time: worth retrying later."""


@app.handler(
    settings.app.topic or "",
    policy=RetryPolicy(delays=settings.app.delays, jitter=0.1, non_retryable=(KeyError, ValueError)),
    value_deserializer=json_value,
)
def charge(record: Record[dict[str, object]]) -> None:
    """Charge an order; side effects are keyed by `record.origin_message_id`, so a redelivery is harmless."""
    order = record.value
    amount = order["amount_cents"]  # a missing field is a KeyError: non-retryable, straight to the DLQ
    if not isinstance(amount, int) or amount <= 0:
        raise NonRetryable(ValueError(f"invalid amount {amount!r}"))
    if random.random() < 0.05:
        raise GatewayTimeout(f"gateway timed out charging {record.origin_message_id}")
    log.info("charged %s cents", amount, extra={"origin_message_id": record.origin_message_id})
