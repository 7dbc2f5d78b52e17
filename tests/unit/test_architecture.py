"""The house rules that keep the core pure and the I/O at the edges, checked on the source:

- pure modules import only the standard library and other pure modules;
- the runtime may add tenacity and the I/O ports, never a Kafka client;
- only `connectors/` (and the Spark jobs) import confluent_kafka, fastavro or pyspark;
- nothing in the package unpickles, evals or imports by a name that could come from a record;
- the facade's `__all__` is complete for what it imports, and sorted within each group (isort style).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = {
    "durations",
    "policy",
    "backoff",
    "classify",
    "naming",
    "headers",
    "router",
    "offsets",
    "schedule",
    "dedupe",
    "events",
    "record",
    "ports",
    "errors",
    "progress",
    "traces",
    "redaction",
    "signing",
    "memory",
    "step",
    "diagnostics",
    "transactions",
    "key_order",
}
CLIENT_LIBRARIES = {"confluent_kafka", "fastavro", "pyspark"}
STDLIB = set(sys.stdlib_module_names)
IO_CONNECTORS = {f"retrytopics.connectors.{m}" for m in ("clients", "kafka", "admin", "embedded", "spark_kafka")}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _library_modules() -> list[Path]:
    return sorted((ROOT / "retrytopics").rglob("*.py"))


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_import_only_the_standard_library(name: str) -> None:
    for module in _imports(ROOT / "retrytopics" / f"{name}.py"):
        top = module.split(".")[0]
        if top == "retrytopics":
            assert module.split(".")[1] in PURE, f"{name} imports non-pure {module}"
        else:
            assert top in STDLIB, f"{name} imports {module}"


def test_no_kafka_or_avro_client_outside_connectors_and_spark() -> None:
    for path in _library_modules():
        tops = {m.split(".")[0] for m in _imports(path)}
        assert not tops & CLIENT_LIBRARIES, f"{path.relative_to(ROOT)} imports {tops & CLIENT_LIBRARIES}"


def test_runtime_imports_no_client_library() -> None:
    for path in (ROOT / "retrytopics" / "runtime").glob("*.py"):
        for module in _imports(path):
            top = module.split(".")[0]
            assert top in STDLIB or top in {"retrytopics", "tenacity"}, f"{path.name} imports {module}"
            # deserializers (connectors.serde) are plain callables; clients and admin are I/O the ports hide
            assert module not in IO_CONNECTORS, f"{path.name} imports {module}"


@pytest.mark.parametrize("folder", ["retrytopics", "connectors", "spark", "pyspark_retrytopics"])
def test_nothing_deserializes_code_from_data(folder: str) -> None:
    forbidden_calls = {"eval", "exec", "__import__"}
    forbidden_modules = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "yaml"}
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text())
        tops = {m.split(".")[0] for m in _imports(path)}
        assert not tops & forbidden_modules, f"{path.relative_to(ROOT)} imports {tops & forbidden_modules}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in forbidden_calls, (
                    f"{path.relative_to(ROOT)}:{node.lineno} calls {node.func.id}"
                )


def test_facade_exports_are_complete_and_grouped_sorted() -> None:
    import retrytopics

    tree = ast.parse((ROOT / "retrytopics" / "__init__.py").read_text())
    imported = {
        alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names
    } - {"annotations"}
    assert set(retrytopics.__all__) == imported
    source = (ROOT / "retrytopics" / "__init__.py").read_text()
    block = source[source.index("__all__") :]
    groups: list[list[str]] = [[]]
    for line in block.splitlines()[1:]:
        line = line.strip()
        if line.startswith("#"):
            groups.append([])
        elif line.startswith('"'):
            groups[-1].append(line.strip('",'))

    def isort_key(name: str) -> tuple[int, str]:  # CONSTANTS, then Classes, then functions (ruff's RUF022)
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    for group in groups:
        assert group == sorted(group, key=isort_key), group
