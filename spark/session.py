"""A Spark session for the audit and replay jobs: `local[*]` by default, the cluster's when submitted."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pyspark import SparkConf
from pyspark.sql import SparkSession

from retrytopics.connectors.jars import SPARK_SQL_KAFKA, cached, spark_connector_version, spark_kafka_jars
from retrytopics.connectors.spark_kafka import register
from retrytopics.operator.progress import JobStatus, StatusLine, note, step

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "builtin_kafka_jars",
    "driver_java_options",
    "get_session",
    "job_status",
    "job_step",
    "local_shuffle_partitions",
    "spark_progress",
    "warm_up_workers",
]

_log = logging.getLogger(__name__)

_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
#: Spark's JVM prints errors only, to stderr, as Spark's own template formats them. The root level stays
#: WARN, the level a PySpark driver (a "shell" to Spark) switches to, announcing the switch on stderr when
#: the root level differs; the console appender's threshold filter drops the WARN lines instead.
_LOG4J2_PROPERTIES = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""
# pyspark warns on every Python worker start when pandas >= 3 is installed; nothing an operator can act on.
_PANDAS_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"
_log4j2_file: list[str] = []  # written once per process, removed at exit


def get_session(master: str | None = None, app_name: str = "retrytopics", *, short_job: bool = False) -> SparkSession:
    """The active session, or a new one. `master=None` keeps what spark-submit set, else `local[*]`.

    Python workers must run an interpreter that has retrytopics and confluent-kafka: locally this one
    (PYSPARK_PYTHON defaults to sys.executable here); on a cluster, the packed venv (docs/spark.md).
    A new local session gets `local_shuffle_partitions` and `warm_up_workers`; an active session is
    returned untouched. `short_job=True` (the demo: one small audit, then exit) also starts a new local
    driver JVM with C1-only JIT (`-XX:TieredStopAtLevel=1`, see `driver_java_options`): it starts faster
    and compiles less; on 2 cores the demo's audit took about a quarter less time. Long jobs on big data
    want the default JIT. A new driver JVM logs errors only (`driver_java_options`)."""
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
    quiet_python_warnings()
    started = time.monotonic()
    step("starting the Spark session")
    java_options = driver_java_options(short_job=short_job and (master or "").startswith("local"))
    if java_options:
        builder = builder.config(_JAVA_OPTIONS, java_options)
    connector = builtin_kafka_jars()
    if connector and not SparkConf().contains("spark.jars"):
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in connector))
    session = builder.getOrCreate()
    local_shuffle_partitions(session)
    register(session)
    warm_up_workers(session)
    note(f"Spark session started ({session.sparkContext.master}, {time.monotonic() - started:.1f}s)")
    step(f"{app_name}: running")
    return session


def job_step(spark: SparkSession, text: str) -> None:
    """Name what the driver does next: the description of the Spark jobs this thread starts from now on
    (shown in Spark's UI) and the step of the terminal's progress line (`spark_progress`)."""
    spark.sparkContext.setJobDescription(text)
    step(text)


def job_status() -> JobStatus | None:
    """Stage and task counts of the active Spark jobs of this driver, from Spark's status tracker; None
    before a session exists. Safe to call from any thread."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return None
    tracker = context.statusTracker()
    jobs = [job for job in map(tracker.getJobInfo, tracker.getActiveJobsIds()) if job is not None]
    stages = [stage for job in jobs for stage in map(tracker.getStageInfo, job.stageIds)]
    known = [stage for stage in stages if stage is not None]
    return JobStatus(
        jobs=len(jobs),
        stages=len(stages),
        stages_done=sum(1 for s in known if s.numTasks and s.numCompletedTasks >= s.numTasks),
        tasks=sum(s.numTasks for s in known),
        tasks_done=sum(s.numCompletedTasks for s in known),
        tasks_running=sum(s.numActiveTasks for s in known),
    )


@contextmanager
def spark_progress(out: TextIO | None, *, enabled: bool = True) -> Iterator[None]:
    """While the block runs, one progress line on `out` (a terminal) with the step the job code names
    (`job_step`, `retrytopics.operator.progress.step`/`note`) and the stage and task counts of the active Spark
    jobs; nothing at all when `enabled` is false or `out` is not a terminal (piped, redirected, `--json`)."""
    if out is None or not enabled or not out.isatty():
        yield
        return
    with StatusLine(out, poll=job_status).active():
        yield


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


def driver_java_options(*, short_job: bool) -> str:
    """`spark.driver.extraJavaOptions` for a driver JVM this process starts: the options already set
    (spark-submit, the builder), plus C1-only JIT for a short job, plus Spark's logging at ERROR through a
    log4j2 properties file unless a log4j2 configuration is already named. Without it, every audit and
    replay printed about a dozen lines (Spark's default log4j profile, WARN lines about the hostname,
    native Hadoop, the UI port, the data source registration) whatever --log-level said."""
    current = SparkConf().get(_JAVA_OPTIONS, "") or ""
    options = current.split()
    if short_job and "-XX:TieredStopAtLevel=1" not in options:
        options.append("-XX:TieredStopAtLevel=1")
    if "log4j2.configurationFile" not in current:
        options.append(f"-Dlog4j2.configurationFile=file:{_log4j2_properties()}")
    return " ".join(options)


def _log4j2_properties() -> str:
    """A private copy of the logging configuration (a file in the shared temp folder could be replaced by
    another user before the JVM reads it)."""
    if not _log4j2_file:
        handle, path = tempfile.mkstemp(prefix="retrytopics-log4j2-", suffix=".properties")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(_LOG4J2_PROPERTIES)
        atexit.register(os.unlink, path)
        _log4j2_file.append(path)
    return _log4j2_file[0]


def quiet_python_warnings() -> None:
    """Silence pyspark's pandas-version FutureWarning here and, through PYTHONWARNINGS (inherited by the
    JVM and the Python workers it starts), in the workers; a PYTHONWARNINGS the user set is extended."""
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    current = os.environ.get("PYTHONWARNINGS", "")
    if _PANDAS_WARNING not in current:
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [current, _PANDAS_WARNING]))


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
