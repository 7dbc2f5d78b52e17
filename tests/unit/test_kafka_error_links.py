"""A confluent-kafka exception whose `__context__` is a bare KafkaError (set from C, as the client does after
a failed rebalance callback) must still format: otherwise logging the failure, and pytest reporting it, fail
with AttributeError '__traceback__'."""

from __future__ import annotations

import ctypes
import traceback

import pytest
from confluent_kafka import KafkaError, KafkaException

from retrytopics.connectors.kafka import map_kafka_errors
from retrytopics.core.errors import KafkaClientError


def _with_bare_context(exc: BaseException, context: object) -> None:
    set_context = ctypes.pythonapi.PyException_SetContext
    set_context.argtypes = [ctypes.py_object, ctypes.py_object]
    set_context.restype = None
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(context))  # PyException_SetContext steals a reference
    set_context(exc, context)


def test_an_error_with_a_bare_kafka_error_as_context_still_formats() -> None:
    inner = KafkaException(KafkaError(KafkaError._STATE, "Failed to set assignment"))
    _with_bare_context(inner, KafkaError(KafkaError._STATE))
    with pytest.raises(AttributeError):
        traceback.format_exception(inner)  # what broke logging and pytest before

    with pytest.raises(KafkaClientError) as info:
        with map_kafka_errors():
            raise inner
    text = "".join(traceback.format_exception(info.value))
    assert "_STATE: Failed to set assignment" in text and "KafkaException" in text
