"""The suite's own scheduling (tests/conftest.py): under `--dist loadfile` the files that take longest start
first, so that a long file never ends a run while the other worker idles (docs/testing.md)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import pytest


@dataclass(frozen=True)
class _Item:
    nodeid: str


def _suite_conftest(config: pytest.Config) -> ModuleType:
    [conftest] = [
        plugin
        for plugin in config.pluginmanager.get_plugins()
        if isinstance(plugin, ModuleType) and hasattr(plugin, "LONGEST_FILES")
    ]
    return conftest


def test_the_longest_files_come_first_in_their_order_and_the_rest_keep_theirs(pytestconfig: pytest.Config) -> None:
    conftest = _suite_conftest(pytestconfig)
    longest = list(conftest.LONGEST_FILES)
    # collection order: short files between and before the long ones, a long file's tests in their order
    items = [
        _Item("tests/unit/test_a.py::test_1"),
        _Item(f"{longest[1]}::test_x"),
        _Item("tests/integration/test_b.py::test_2[p]"),
        _Item(f"{longest[0]}::test_y"),
        _Item(f"{longest[1]}::test_z"),
        _Item("tests/unit/test_a.py::test_3"),
    ]

    conftest.pytest_collection_modifyitems(pytestconfig, items)

    assert [item.nodeid for item in items] == [
        f"{longest[0]}::test_y",
        f"{longest[1]}::test_x",
        f"{longest[1]}::test_z",
        "tests/unit/test_a.py::test_1",
        "tests/integration/test_b.py::test_2[p]",
        "tests/unit/test_a.py::test_3",
    ]


def test_xdist_keeps_the_collections_order_and_every_listed_file_exists(pytestconfig: pytest.Config) -> None:
    conftest = _suite_conftest(pytestconfig)
    assert pytestconfig.option.loadscopereorder is False  # as --no-loadscope-reorder
    assert all((pytestconfig.rootpath / path).is_file() for path in conftest.LONGEST_FILES)
    assert len(set(conftest.LONGEST_FILES)) == len(conftest.LONGEST_FILES)
