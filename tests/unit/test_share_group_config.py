"""Setting a share group's configs (connectors/admin.py) against an admin client whose brokers apply a group
config a moment after the controller accepted it, as KRaft brokers do: `set_share_group_config` returns only
once the configs are applied, so a member joining right after it starts with them."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest

from retrytopics.connectors.admin import ShareGroupConfig, set_share_group_config, share_group_config
from retrytopics.core.errors import KafkaClientError


@dataclass
class _Entry:
    value: str | None


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class _LaggingAdmin:
    """Accepts an incremental change at once; its describes show it only from the `lag`-th one on (never for a
    negative lag)."""

    def __init__(self, lag: int) -> None:
        self.applied = {"share.auto.offset.reset": "latest", "share.record.lock.duration.ms": "30000"}
        self.accepted: dict[str, str] = {}
        self.lag = lag
        self.describes = 0

    def incremental_alter_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future[Any]]:
        for resource in resources:
            self.accepted.update({entry.name: entry.value for entry in resource.incremental_configs})
        return {resource: _done(None) for resource in resources}

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future[Any]]:
        self.describes += 1
        if 0 <= self.lag < self.describes:
            self.applied.update(self.accepted)
        return {resources[0]: _done({name: _Entry(value) for name, value in self.applied.items()})}


def test_set_returns_only_once_the_broker_applies_the_configs() -> None:
    """The broker shows the new configs from its third describe on: `set_share_group_config` returns after
    them, so the first read after it sees them."""
    admin = _LaggingAdmin(lag=2)
    set_share_group_config(
        admin,  # type: ignore[arg-type]
        "billing",
        ShareGroupConfig(auto_offset_reset="earliest", record_lock_duration_ms=15_000),
    )
    config = share_group_config(admin, "billing")  # type: ignore[arg-type]
    assert config["share.auto.offset.reset"] == "earliest"
    assert config["share.record.lock.duration.ms"] == "15000"


def test_configs_never_applied_are_an_error_naming_them() -> None:
    """A broker that never shows them: a retriable `KafkaClientError` within the timeout, naming each config
    not applied and the group."""
    admin = _LaggingAdmin(lag=-1)
    with pytest.raises(KafkaClientError) as failed:
        set_share_group_config(
            admin,  # type: ignore[arg-type]
            "billing",
            ShareGroupConfig(auto_offset_reset="earliest", record_lock_duration_ms=30_000),
            timeout_s=0.3,
        )
    assert failed.value.retriable
    assert "share.auto.offset.reset" in str(failed.value) and "billing" in str(failed.value)
    assert "share.record.lock.duration.ms" not in str(failed.value), "an unchanged value is applied already"
