"""The Maven cache for Apache Kafka and Spark's Kafka connector: where it lives, when it counts as
resolved, clear errors, and which connector jars reach Spark's class path. No Maven run here."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrytopics.connectors import jars
from retrytopics.core.errors import BrokerBinaryMissing


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RETRYTOPICS_CACHE", str(tmp_path))
    return tmp_path


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RETRYTOPICS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jars.cache_root() == tmp_path / "retrytopics"
    monkeypatch.setenv("RETRYTOPICS_CACHE", "/somewhere")
    assert jars.cache_root() == Path("/somewhere")


def test_a_folder_counts_only_once_marked_complete(cache: Path) -> None:
    folder = cache / f"kafka-{jars.KAFKA_VERSION}"
    folder.mkdir()
    (folder / "kafka_2.13.jar").write_bytes(b"")
    assert jars.cached(jars.KAFKA_BROKER) is None  # an interrupted resolution is not used
    (folder / ".complete").write_text("kafka\n")
    assert jars.cached(jars.KAFKA_BROKER) == folder
    assert jars.resolve(jars.KAFKA_BROKER) == folder  # cached: Maven is not run


def test_without_maven_the_error_says_what_to_do(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jars.shutil, "which", lambda name: None)
    with pytest.raises(BrokerBinaryMissing, match=r"`mvn` is not installed.*scripts/setup.sh"):
        jars.resolve(jars.KAFKA_BROKER)


def test_a_failed_resolution_leaves_nothing_behind(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failing = cache / "mvn"
    failing.write_text("#!/bin/sh\necho 'Could not resolve dependencies for org.apache.kafka' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(jars.shutil, "which", lambda name: str(failing))
    with pytest.raises(BrokerBinaryMissing, match=r"(?s)could not resolve kafka 9\.9\.9 \(exit 1\).*Could not resolve"):
        jars.resolve(jars.KAFKA_BROKER, "9.9.9")
    assert [p.name for p in cache.iterdir()] == ["mvn"]


def test_versions_are_checked_before_they_reach_a_path(cache: Path) -> None:
    with pytest.raises(ValueError, match="not a release version"):
        jars.cached(jars.KAFKA_BROKER, "../../etc")


def test_connector_version_follows_pyspark() -> None:
    assert jars.spark_connector_version("4.2.0") == "4.2.0"
    assert jars.spark_connector_version("4.2.0.dev1") == "4.2.0"
    with pytest.raises(ValueError):
        jars.spark_connector_version("nightly")


def test_spark_gets_only_the_jars_it_does_not_ship(tmp_path: Path) -> None:
    connector, spark_home = tmp_path / "connector", tmp_path / "spark"
    connector.mkdir(), spark_home.mkdir()
    for name in (
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
        "kafka-clients-3.9.2.jar",
        "commons-pool2-2.13.1.jar",
        "scala-library-2.13.15.jar",
        "slf4j-api-1.7.36.jar",
        "hadoop-client-runtime-3.5.0.jar",
    ):
        (connector / name).write_bytes(b"")
    for name in ("scala-library-2.13.16.jar", "slf4j-api-2.0.17.jar", "hadoop-client-runtime-3.4.1.jar"):
        (spark_home / name).write_bytes(b"")
    chosen = [p.name for p in jars.spark_kafka_jars(connector, spark_home)]
    assert chosen == ["commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"]


def test_cluster_ids_never_look_like_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from retrytopics.connectors import apache

    leading_dash = uuid.UUID(bytes=b"\xfb" + bytes(15))  # base64url of 0xfb... starts with "-"
    ids = iter([leading_dash, uuid.UUID(int=1)])
    monkeypatch.setattr(apache.uuid, "uuid4", lambda: next(ids))
    assert not apache.new_cluster_id().startswith("-")
