"""A Spark session for the audit and replay jobs: `local[*]` by default, the cluster's when submitted."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark import SparkConf
from pyspark.sql import SparkSession

from retrytopics.connectors.jars import SPARK_SQL_KAFKA, cached, spark_connector_version, spark_kafka_jars
from retrytopics.connectors.spark_kafka import register

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["builtin_kafka_jars", "get_session", "local_shuffle_partitions", "warm_up_workers"]

_log = logging.getLogger(__name__)

_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def get_session(master: str | None = None, app_name: str = "retrytopics", *, short_job: bool = False) -> SparkSession:
    """The active session, or a new one. `master=None` keeps what spark-submit set, else `local[*]`.

    Python workers must run an interpreter that has retrytopics and confluent-kafka: locally this one
    (PYSPARK_PYTHON defaults to sys.executable here); on a cluster, the packed venv (docs/spark.md).
    A new local session gets `local_shuffle_partitions` and `warm_up_workers`; an active session is
    returned untouched. `short_job=True` (the demo: one small audit, then exit) also starts a new local
    driver JVM with C1-only JIT (`-XX:TieredStopAtLevel=1` in spark.driver.extraJavaOptions, replacing a
    value from spark-defaults.conf): it starts faster and compiles less; on 2 cores the demo's audit took
    about a quarter less time. Long jobs on big data want the default JIT."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    if master is None and not SparkConf().contains("spark.master"):
        master = "local[*]"  # not under spark-submit
    if master is not None:
        builder = builder.master(master)
    if short_job and (master or "").startswith("local"):
        builder = builder.config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    connector = builtin_kafka_jars()
    if connector and not SparkConf().contains("spark.jars"):
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in connector))
    session = builder.getOrCreate()
    local_shuffle_partitions(session)
    register(session)
    warm_up_workers(session)
    return session


def builtin_kafka_jars() -> list[Path]:
    """The jars of Spark's own Kafka connector (`format("kafka")`, `--kafka-format builtin`) for the installed
    pyspark, when `scripts/setup.sh` resolved them into the cache; [] otherwise (the Python data source
    needs none). Only jars that pyspark does not ship itself, so no second Scala or Hadoop is loaded."""
    import pyspark

    version = spark_connector_version(pyspark.__version__)
    folder = cached(SPARK_SQL_KAFKA, version)
    if folder is None:
        return []
    return spark_kafka_jars(folder, Path(pyspark.__file__).parent / "jars")


def local_shuffle_partitions(session: SparkSession) -> int | None:
    """On a local master with no explicit `spark.sql.shuffle.partitions`, set it to the local core count.

    Spark's default of 200 shuffle partitions costs 200 tasks per aggregation: on a 2-core machine the
    audit of a few thousand records spent most of its time scheduling them. A setting from spark-submit,
    spark-defaults.conf, the builder or `spark.conf.set` is never overridden. Returns the value set, or None."""
    context = session.sparkContext
    if not (context.master or "").startswith("local") or context.getConf().contains(_SHUFFLE_PARTITIONS):
        return None
    if session.conf.get(_SHUFFLE_PARTITIONS) != "200":  # changed at runtime: the user's choice
        return None
    partitions = max(1, context.defaultParallelism)
    session.conf.set(_SHUFFLE_PARTITIONS, str(partitions))
    return partitions


def _prepare_worker(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs in a Python worker: import what a Kafka read task needs. pyarrow imports pandas on its first
    conversion from Python lists (about 1 s), so that happens here too."""
    import pyarrow as pa

    from retrytopics.connectors import spark_kafka, spark_kafka_io  # noqa: F401

    pa.array([b""])
    yield from batches


def warm_up_workers(session: SparkSession) -> threading.Thread | None:
    """On a local master, start one Python worker per core in the background, with the data source's
    read path imported; returns the thread (None elsewhere).

    The first Kafka read of a session otherwise waits for the worker daemon, then for each worker's imports
    (about 3 s on 2 cores) after the driver has planned the query; started with the session, that work
    overlaps the driver's. Workers are reused (`spark.python.worker.reuse`, Spark's default), so later
    tasks find them ready. A failure here is only logged: the real job starts its workers itself."""
    context = session.sparkContext
    if not (context.master or "").startswith("local"):
        return None
    slots = max(1, context.defaultParallelism)

    def run() -> None:
        try:
            context.setJobDescription("retrytopics: start Python workers")
            # Through Spark SQL, not an RDD: SQL tasks get their workers from their own daemon.
            session.range(slots, numPartitions=slots).mapInArrow(_prepare_worker, "id long").write.format("noop").mode(
                "overwrite"
            ).save()
        except Exception:  # noqa: BLE001 - an optimisation only; the session may also have been stopped
            _log.debug("warming up Python workers failed", exc_info=True)

    thread = threading.Thread(target=run, name="retrytopics-spark-warm-up", daemon=True)
    thread.start()
    return thread
