"""The main consumer: one consumer in the app's group, subscribed to every handled source topic.

Source records never carry trusted retry state: incoming `retry.*` headers are ignored there (a producer of
the source topic could forge them), so every source record gets a normal first delivery.
"""

from __future__ import annotations

from collections.abc import Sequence

from retrytopics.runtime.loop import LoopSettings

__all__ = ["main_settings"]


def main_settings(group: str, topics: Sequence[str], **options: object) -> LoopSettings:
    """Settings of the main consumer of `group` over `topics`."""
    return LoopSettings(name=f"{group}:main", group_id=group, topics=tuple(topics), **options)  # type: ignore[arg-type]
