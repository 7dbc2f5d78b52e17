"""The bounds and the error excerpt the key-order wire forms share (key-state records, follower headers): every byte
of them is untrusted, so each decoder checks against the same limits and quotes what it refused the same way.
"""

from __future__ import annotations

from typing import Final

__all__ = ["INT32_MAX", "INT64_MAX", "excerpt"]


#: Kafka's partition and offset ranges
INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1


def excerpt(value: object) -> object:
    """A bounded, printable stand-in for untrusted data in an error."""
    if isinstance(value, bytes | str):
        return value if len(value) <= 64 else value[:64]
    if value is None or isinstance(value, bool | int):
        return value
    return f"<{type(value).__name__}>"
