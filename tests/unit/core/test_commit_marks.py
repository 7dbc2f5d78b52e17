"""The commit mark and the seed floor a partition's next owner reads from it (core/commit_marks.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrytopics.core.commit_marks import MARK_PREFIX, commit_mark, seed_floor

NOW = 1_790_000_000_000


@given(st.integers(min_value=0, max_value=10**15 - 1))
def test_a_floor_written_into_a_mark_is_read_back(floor: int) -> None:
    assert seed_floor(commit_mark(floor), NOW) == floor


def test_no_committed_offset_counts_every_hop_found() -> None:
    assert seed_floor(None, NOW) == 0


@pytest.mark.parametrize(
    "metadata",
    [
        "",  # kafka-consumer-groups --reset-offsets
        "reset by ops",
        f"{MARK_PREFIX}",
        f"{MARK_PREFIX}-5",
        f"{MARK_PREFIX}12a",
        f"{MARK_PREFIX}١٢٣",  # digits, but not ASCII ones
        f"{MARK_PREFIX}{'9' * 16}",
        f" {MARK_PREFIX}5",
    ],
)
def test_an_offset_someone_else_committed_starts_the_floor_now(metadata: str) -> None:
    assert seed_floor(metadata, NOW) == NOW


def test_a_negative_floor_is_refused() -> None:
    with pytest.raises(ValueError, match="floor_ms"):
        commit_mark(-1)
