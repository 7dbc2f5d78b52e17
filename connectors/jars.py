"""Java artifacts the project runs but never commits: Apache Kafka's broker jars and Spark's own Kafka
connector, resolved with Maven into a per-user cache.

Each artifact set is a small pom beside this module (`connectors/*.pom.xml`); `resolve()` runs
`mvn dependency:copy-dependencies` once into `~/.cache/retrytopics/<name>-<version>/` (or
`$RETRYTOPICS_CACHE`, else `$XDG_CACHE_HOME/retrytopics`) and marks the folder complete only after Maven
succeeded, so an interrupted resolution is redone, never half-used. Later calls only read the folder::

    kafka = resolve(KAFKA_BROKER)                     # Path to a folder of jars
    spark = resolve(SPARK_SQL_KAFKA, "4.2.0")

`scripts/setup.sh` calls `python -m retrytopics.connectors.jars` to fetch everything up front.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from retrytopics.core.errors import BrokerBinaryMissing

__all__ = [
    "KAFKA_BROKER",
    "KAFKA_VERSION",
    "SPARK_SQL_KAFKA",
    "Artifact",
    "cache_root",
    "cached",
    "resolve",
    "spark_connector_version",
    "spark_kafka_jars",
]

#: The Apache Kafka release the project tests and benchmarks on (KRaft, Java 17).
KAFKA_VERSION = "4.1.1"

_COMPLETE = ".complete"
_POMS = Path(__file__).parent


@dataclass(frozen=True, slots=True)
class Artifact:
    """A set of jars described by one pom beside this module."""

    name: str  # cache folder prefix
    pom: str  # file name beside this module
    version_property: str  # the pom property that selects the version
    default_version: str


KAFKA_BROKER = Artifact("kafka", "kafka-broker.pom.xml", "kafka.version", KAFKA_VERSION)
#: Spark's connector must match the installed pyspark's version (see `spark_connector_version`).
SPARK_SQL_KAFKA = Artifact("spark-sql-kafka", "spark-sql-kafka.pom.xml", "spark.version", "4.2.0")


def cache_root() -> Path:
    explicit = os.environ.get("RETRYTOPICS_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "retrytopics"


def _folder(artifact: Artifact, version: str) -> Path:
    if not re.fullmatch(r"[0-9][0-9A-Za-z.\-]*", version):
        raise ValueError(f"not a release version: {version!r}")
    return cache_root() / f"{artifact.name}-{version}"


def cached(artifact: Artifact, version: str | None = None) -> Path | None:
    """The folder of jars if a previous resolution completed, else None. Never runs Maven."""
    folder = _folder(artifact, version or artifact.default_version)
    return folder if (folder / _COMPLETE).is_file() else None


def resolve(artifact: Artifact, version: str | None = None, *, quiet: bool = True) -> Path:
    """The folder of jars, running Maven first if they are not cached yet.

    Raises BrokerBinaryMissing with what to do when `mvn` is missing or the resolution fails."""
    version = version or artifact.default_version
    done = cached(artifact, version)
    if done is not None:
        return done
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerBinaryMissing(
            f"{artifact.name} {version} jars are not in {cache_root()} and `mvn` is not installed: install "
            "Maven 3.8+ (Debian: apt-get install maven) and run scripts/setup.sh, or use the embedded broker"
        )
    folder = _folder(artifact, version)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    command = [
        mvn,
        "--batch-mode",
        *(["--quiet"] if quiet else []),
        "-f",
        str(_POMS / artifact.pom),
        f"-D{artifact.version_property}={version}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    if result.returncode != 0 or not any(staging.glob("*.jar")):
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BrokerBinaryMissing(
            f"Maven could not resolve {artifact.name} {version} (exit {result.returncode}). Check that Maven "
            f"Central is reachable (a mirror in ~/.m2/settings.xml works too) and rerun scripts/setup.sh.\n{tail}"
        )
    (staging / _COMPLETE).write_text(f"{artifact.name} {version}\n")
    if folder.exists():  # an incomplete earlier attempt
        shutil.rmtree(folder)
    staging.rename(folder)
    return folder


def spark_connector_version(pyspark_version: str) -> str:
    """The connector release for a pyspark release: the same version, without local suffixes."""
    match = re.match(r"(\d+\.\d+\.\d+)", pyspark_version)
    if match is None:
        raise ValueError(f"cannot read a Spark release from pyspark version {pyspark_version!r}")
    return match.group(1)


def _artifact_name(jar: Path) -> str:
    match = re.match(r"(.+?)-\d[^-]*(-[A-Za-z].*)?\.jar$", jar.name)
    return match.group(1) if match else jar.stem


def spark_kafka_jars(folder: Path, spark_home_jars: Path) -> list[Path]:
    """The connector's jars that the pyspark distribution does not already ship (by artifact name), so
    that no second copy of Scala, Hadoop or SLF4J lands on the class path."""
    shipped = {_artifact_name(jar) for jar in spark_home_jars.glob("*.jar")}
    return sorted(jar for jar in folder.glob("*.jar") if _artifact_name(jar) not in shipped)


def _main(argv: list[str]) -> int:
    """`python -m retrytopics.connectors.jars [kafka] [spark]`: resolve into the cache, print folders."""
    wanted = argv or ["kafka", "spark"]
    for name in wanted:
        if name == "kafka":
            print(f"kafka {KAFKA_VERSION}: {resolve(KAFKA_BROKER)}")
        elif name == "spark":
            import pyspark

            version = spark_connector_version(pyspark.__version__)
            print(f"spark-sql-kafka {version}: {resolve(SPARK_SQL_KAFKA, version)}")
        else:
            print(f"unknown artifact set {name!r}; expected kafka or spark", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv[1:]))
    except BrokerBinaryMissing as exc:
        print(f"setup: {exc}", file=sys.stderr)
        sys.exit(1)
