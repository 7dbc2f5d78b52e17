"""`retrytopics.errors` is a real module, and every public error and signal survives pickling with its class,
message and fields: a user's multiprocessing pool or task queue that raises one gets it back whole."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
from datetime import timedelta

import pytest

import retrytopics
from retrytopics import errors

CASES = [
    errors.ConfigError("policy.delays", ["5x"], "not a duration"),
    errors.HeaderDecodeError("retry.due_at", b"soon", "not an integer"),
    errors.KeyStateDecodeError("head", -1, "negative"),
    errors.DeliveryLimitReached(5, 5),
    errors.PoisonRecordError("orders", 2, 41, b"\xff{", ValueError("bad json")),
    errors.KafkaClientError("broker down", code="_TRANSPORT", retriable=True),
    errors.PublishError("orders.retry.5s", "timed out", code="_MSG_TIMED_OUT", retriable=True, fatal=False),
    errors.TopicMismatchError("orders", 3, 6),
    errors.EmbeddedBrokerError("no broker"),
    errors.BrokerBinaryMissing("install the embedded extra"),
    errors.BrokerPortInUse("port 9092 taken"),
    errors.BrokerExitedEarly("exited with 1", "panic: at the disco"),
    errors.Retry("later", after=timedelta(seconds=30)),
    errors.Retry(after="5s"),
    errors.NonRetryable(ValueError("invalid amount")),
    errors.BatchFailed([("record-a", ValueError("a")), ("record-b", errors.Retry(after="1s"))]),
]


def test_the_module_imports_on_its_own_in_a_fresh_interpreter() -> None:
    subprocess.run([sys.executable, "-c", "import retrytopics.errors as e; e.ConfigError"], check=True)
    assert importlib.import_module("retrytopics.errors") is retrytopics.errors


def test_every_public_error_is_named_by_the_module_it_is_imported_from() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert cls.__module__ == "retrytopics.errors", name
        assert getattr(retrytopics, name, cls) is cls, name
    assert sorted(errors.__all__) == errors.__all__
    assert {type(error).__name__ for error in CASES} == set(errors.__all__) - {"RetryTopicsError"}


@pytest.mark.parametrize("error", CASES, ids=lambda error: type(error).__name__)
def test_an_error_pickles_and_unpickles_with_its_class_message_and_fields(error: BaseException) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert _fields(copy) == _fields(error)


def _fields(error: BaseException) -> dict[str, object]:
    # exceptions compare by identity: a nested cause is compared by its type and message
    return {
        name: (type(value), str(value)) if isinstance(value, BaseException) else _plain(value)
        for name, value in vars(error).items()
    }


def _plain(value: object) -> object:
    if isinstance(value, list):
        return [tuple(_plain(part) for part in item) if isinstance(item, tuple) else _plain(item) for item in value]
    if isinstance(value, BaseException):
        return (type(value), str(value))
    return value
