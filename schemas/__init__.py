"""Avro schemas shipped with retrytopics (`.avsc` files beside this module), read with fastavro.

from retrytopics.schemas import load_schema
order = load_schema("order")        # parsed by fastavro, ready for schemaless_reader/writer
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

__all__ = ["load_schema", "schema_names", "schema_text"]


def schema_names() -> list[str]:
    """Names of the bundled schemas, e.g. ["dlq_record", "order", "retry_headers"]."""
    return sorted(p.name[: -len(".avsc")] for p in files(__name__).iterdir() if p.name.endswith(".avsc"))


def schema_text(name: str) -> str:
    """The raw JSON text of a bundled schema."""
    if name not in schema_names():
        raise KeyError(f"no bundled schema {name!r}; have {schema_names()}")
    return files(__name__).joinpath(f"{name}.avsc").read_text(encoding="utf-8")


@cache
def load_schema(name: str) -> Any:
    """A bundled schema parsed with fastavro (`fastavro.parse_schema`)."""
    import fastavro

    return fastavro.parse_schema(json.loads(schema_text(name)))
