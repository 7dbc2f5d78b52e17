"""The house rules that keep the layers of the package visible in its tree, checked on the source:

- `core/` (the pure core) imports only the standard library and the core;
- `observe/` imports the standard library, the core and itself (and its metrics library, the `metrics` extra);
- the in-memory broker (`testing/broker.py`) is as pure as the core it stands behind the ports of;
- no layer imports `testing/` (the in-memory broker and test helpers): the product never runs on its fakes;
- the runtime may add tenacity and the I/O ports, never a Kafka client, and nothing of the operator's side;
- only the operator's side (`operator/`, `console/`, and the Spark jobs the operator's commands run and whose
  progress lines and reports are the operator's) imports `operator/` or `console/`;
- the package root holds only the facade and the app's wiring: every other module lives in a layer;
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
PACKAGE = ROOT / "retrytopics"
#: the repository's folders and the package each installs as (pyproject.toml's package-dir)
INSTALLED_AS = {
    "retrytopics": "retrytopics",
    "connectors": "retrytopics.connectors",
    "spark": "retrytopics.spark",
    "pyspark_retrytopics": "pyspark_retrytopics",
}
ROOT_MODULES = {"__init__", "app", "errors", "registry", "client_factory"}
LAYERS = {"core", "observe", "operator", "runtime", "console", "testing"}
#: the in-memory broker: what it imports, the core may
MEMORY_BROKER = ("testing/broker.py",)
OPERATOR_SIDE = {"retrytopics.operator", "retrytopics.console"}
CLIENT_LIBRARIES = {"confluent_kafka", "fastavro", "pyspark"}
METRICS_LIBRARY = "prometheus_client"
STDLIB = set(sys.stdlib_module_names)
IO_CONNECTORS = {f"retrytopics.connectors.{m}" for m in ("clients", "kafka", "admin", "embedded", "spark_kafka")}


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    return ".".join([INSTALLED_AS[folder], *rest])


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, relative imports resolved against its installed package."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if node.module:
                found.add(module)
            else:  # `from . import x`: each name is a module of that package
                found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def _in(module: str, packages: set[str]) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in packages)


def _layer(name: str) -> list[Path]:
    return sorted((PACKAGE / name).rglob("*.py"))


def _library_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _layer("core"), ids=lambda p: p.stem)
def test_core_imports_only_the_standard_library_and_the_core(path: Path) -> None:
    for module in _imports(path):
        assert module.split(".")[0] in STDLIB or _in(module, {"retrytopics.core"}), f"core/{path.name} imports {module}"


@pytest.mark.parametrize("path", _layer("observe"), ids=lambda p: p.stem)
def test_observe_imports_only_the_standard_library_the_core_and_itself(path: Path) -> None:
    for module in _imports(path):
        allowed = module.split(".")[0] in STDLIB | {METRICS_LIBRARY}
        assert allowed or _in(module, {"retrytopics.core", "retrytopics.observe"}), (
            f"observe/{path.name} imports {module}"
        )


@pytest.mark.parametrize("name", MEMORY_BROKER)
def test_the_in_memory_broker_is_as_pure_as_the_core(name: str) -> None:
    for module in _imports(PACKAGE / name):
        assert module.split(".")[0] in STDLIB or _in(module, {"retrytopics.core"}), f"{name} imports {module}"


@pytest.mark.parametrize("layer", sorted(LAYERS - {"testing"}))
def test_no_layer_imports_the_in_memory_broker_or_the_test_helpers(layer: str) -> None:
    for path in _layer(layer):
        imported = {m for m in _imports(path) if _in(m, {"retrytopics.testing"})}
        assert not imported, f"{path.relative_to(ROOT)} imports {imported}"


def test_runtime_imports_no_client_library_and_nothing_of_the_operator_side() -> None:
    for path in _layer("runtime"):
        for module in _imports(path):
            top = module.split(".")[0]
            assert top in STDLIB or top in {"retrytopics", "tenacity"}, f"{path.name} imports {module}"
            # deserializers (connectors.serde) are plain callables; clients and admin are I/O the ports hide
            assert module not in IO_CONNECTORS, f"{path.name} imports {module}"
            assert not _in(module, OPERATOR_SIDE), f"{path.name} imports {module}"


@pytest.mark.parametrize("folder", ["retrytopics", "connectors", "pyspark_retrytopics"])
def test_only_the_operator_side_imports_the_operator_or_the_console(folder: str) -> None:
    operator_side = {PACKAGE / "operator", PACKAGE / "console"}
    for path in sorted((ROOT / folder).rglob("*.py")):
        if operator_side & set(path.parents):
            continue
        imported = {m for m in _imports(path) if _in(m, OPERATOR_SIDE)}
        assert not imported, f"{path.relative_to(ROOT)} imports {imported}"


def test_the_package_root_holds_only_the_facade_the_wiring_and_the_layers() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert modules == ROOT_MODULES, f"put {sorted(modules - ROOT_MODULES)} in a layer (docs/architecture.md, Layers)"
    assert folders == LAYERS, sorted(folders ^ LAYERS)


def test_no_kafka_or_avro_client_outside_connectors_and_spark() -> None:
    for path in _library_modules():
        tops = {m.split(".")[0] for m in _imports(path)}
        assert not tops & CLIENT_LIBRARIES, f"{path.relative_to(ROOT)} imports {tops & CLIENT_LIBRARIES}"


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

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    imported = {
        alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names
    } - {"annotations"}
    assert set(retrytopics.__all__) == imported
    source = (PACKAGE / "__init__.py").read_text()
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


#: inside the runtime, what each part may import of the others (module prefixes under retrytopics.runtime):
#: the records stage yields outcomes and never imports the hand-off, the consumer or key order; key order
#: (a feature behind its seams: an admission step, a hold reason, a hand-off listener) builds on the records
#: stage and is picked by the consumer; waiting and the hand-off know the records stage only by its outcome values
RUNTIME_MAY_IMPORT = {
    "clock": set(),
    "bounded": {"clock"},
    "waiting": {"records.outcome"},
    "records": {"records", "waiting", "clock", "bounded"},
    "keyorder": {"keyorder", "records", "waiting", "clock", "concurrency"},
    "handoff": {"handoff", "records.outcome", "clock", "bounded"},
    "lag": {"clock"},
    "flood": {"flood", "records", "clock"},
    "concurrency": {"concurrency", "records", "waiting", "clock"},
    "consumer": {
        "consumer",
        "records",
        "keyorder",
        "flood",
        "concurrency",
        "waiting",
        "handoff",
        "clock",
        "bounded",
        "lag",
    },
}


def test_inside_the_runtime_imports_go_one_way() -> None:
    runtime = ROOT / "retrytopics" / "runtime"
    for path in sorted(runtime.rglob("*.py")):
        part = path.relative_to(runtime).with_suffix("").parts[0]
        if part == "__init__":
            continue
        allowed = RUNTIME_MAY_IMPORT[part]
        for module in _imports(path):
            if not module.startswith("retrytopics.runtime."):
                continue
            target = module.removeprefix("retrytopics.runtime.")
            assert any(target == a or target.startswith(a + ".") for a in allowed), (
                f"{path.relative_to(ROOT)} ({part}) imports {module}"
            )


def test_only_the_records_stage_tier_path_asks_waiting_and_no_plain_stage_imports_key_order() -> None:
    """Of the records stage, only its tier path (records/tier.py) may ask waiting (runtime/waiting.py); the
    source path, what both share and every other records module know nothing of it. No records module imports
    key order's runtime (runtime/keyorder/): key order reaches the stage through a stage of its own."""
    records = ROOT / "retrytopics" / "runtime" / "records"
    for path in sorted(records.rglob("*.py")):
        for module in _imports(path):
            assert not _in(module, {"retrytopics.runtime.keyorder"}), f"records/{path.name} imports {module}"
            if path.name != "tier.py":
                assert module != "retrytopics.runtime.waiting", f"records/{path.name} imports {module}"
