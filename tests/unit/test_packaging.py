"""The wheel users install contains every package of the design card and the Avro schemas."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("retrytopics-*.whl")
    return zipfile.ZipFile(built)


def test_wheel_maps_the_repository_folders_into_the_namespace(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for module in (
        "retrytopics/__init__.py",
        "retrytopics/connectors/kafka.py",
        "retrytopics/connectors/embedded.py",
        "retrytopics/spark/__init__.py",
    ):
        assert module in names, module
    assert not any(n.startswith(("connectors/", "spark/", "schemas/", "tests/")) for n in names)


def test_wheel_ships_every_package_of_the_repository(wheel: zipfile.ZipFile) -> None:
    """pyproject.toml lists the packages one by one: a new folder left off the list installs without its
    modules, and the app fails to import from the wheel alone."""
    installed_as = {"retrytopics": "retrytopics", "connectors": "retrytopics/connectors", "spark": "retrytopics/spark"}
    installed_as["pyspark_retrytopics"] = "pyspark_retrytopics"
    names = set(wheel.namelist())
    for folder, prefix in installed_as.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            inside = init.relative_to(ROOT / folder).as_posix()
            assert f"{prefix}/{inside}" in names, f"{folder}/{inside}: add its package to pyproject.toml"


def test_wheel_ships_every_avro_schema(wheel: zipfile.ZipFile) -> None:
    in_repo = {p.name for p in (ROOT / "schemas").glob("*.avsc")}
    in_wheel = {Path(n).name for n in wheel.namelist() if n.startswith("retrytopics/schemas/") and n.endswith(".avsc")}
    assert in_wheel == in_repo


def test_console_script_is_declared(wheel: zipfile.ZipFile) -> None:
    entry_points = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    assert "retrytopics = retrytopics.operator.cli:main" in wheel.read(entry_points).decode()


def test_wheel_ships_the_maven_poms_and_no_jar(wheel: zipfile.ZipFile) -> None:
    in_repo = {p.name for p in (ROOT / "connectors").glob("*.pom.xml")}
    in_wheel = {Path(n).name for n in wheel.namelist() if n.endswith(".pom.xml")}
    assert in_repo == {"kafka-broker.pom.xml", "spark-sql-kafka.pom.xml"} and in_wheel == in_repo
    assert not any(n.endswith(".jar") for n in wheel.namelist())


def test_wheel_ships_the_console_templates_and_static_assets(wheel: zipfile.ZipFile) -> None:
    """The console serves its pages and script from the installed package, never from the internet."""
    folder = ROOT / "retrytopics" / "console"
    in_repo = {str(p.relative_to(folder)) for sub in ("templates", "static") for p in (folder / sub).iterdir()}
    prefix = "retrytopics/console/"
    in_wheel = {
        n.removeprefix(prefix) for n in wheel.namelist() if n.startswith((prefix + "templates/", prefix + "static/"))
    }
    assert in_wheel == in_repo and "static/console.js" in in_wheel and "templates/chart.svg" in in_wheel
